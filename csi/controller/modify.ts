// ControllerModifyVolume: a VolumeAttributesClass change reaching the driver. The mutable
// parameters (qos.* only) are merged into the partition's spec.qos, and the call answers once the
// agent reports the target enforcing them (status.qos), online, with the volume in use.
import type { HandlerContext } from "@connectrpc/connect";
import type { NVMePartition } from "../../api/index.ts";
import type { ControllerModifyVolumeRequest } from "../../gen/csi/v1/csi_pb.ts";
import { aborted, csiError, invalidArgument, notFound } from "../errors.ts";
import { canonicalJson } from "./fingerprint.ts";
import { completeQos, parseMutableParameters, requireQosBackend } from "./qos-parameters.ts";
import type { ControllerState } from "./state.ts";
import { progressOf } from "./volume-view.ts";

/**
 * ControllerModifyVolume: sets the named qos.* limits (a key not named keeps its value; 0 lifts
 * that limit) and waits until status.qos shows all four in force. Idempotent: limits already in
 * force answer after one read. INVALID_ARGUMENT for a missing volume_id, an empty map, a key other
 * than qos.*, a malformed value, or limits on a kernel-backend volume (nvmet has no per-namespace
 * QoS); NOT_FOUND for an unknown or gone volume; ABORTED when the volume went away or another
 * call on it runs; DEADLINE_EXCEEDED naming what the agent reported when the budget runs out.
 */
export async function modifyVolume(
  c: ControllerState,
  req: ControllerModifyVolumeRequest,
  ctx: HandlerContext,
): Promise<Record<string, never>> {
  if (!req.volumeId) throw invalidArgument("volume_id is required");
  const asked = parseMutableParameters(req.mutableParameters);
  if (!asked) throw invalidArgument("mutable_parameters is required");
  const ref = c.ref(req.volumeId);
  if (!ref) throw notFound(`volume ${req.volumeId} does not exist`);
  c.requireSynced();
  const key = c.key(ref.name);
  return c.inFlight.run(key, "ControllerModifyVolume", async () => {
    const p = await c.partitionOf(ref);
    if (!p || p.metadata.deletionTimestamp) throw notFound(`volume ${req.volumeId} does not exist`);
    requireQosBackend(p.spec.backend ?? "spdk", asked, `volume ${req.volumeId}`);
    if ((p.spec.backend ?? "spdk") !== "spdk") return {}; // all-zero limits: nvmet is unlimited
    const desired = { ...p.spec.qos, ...asked };
    const want = completeQos(desired);
    let patched = p;
    // Calls on one volume run one at a time (inFlight), so the merge is over the latest spec.
    if (canonicalJson(completeQos(p.spec.qos)) !== canonicalJson(want))
      patched = await c.partClient.mergePatch(ref.name, c.ns, { spec: { qos: desired } });
    const generation = patched.metadata.generation ?? 0;
    let last: NVMePartition | undefined = patched;
    await c.budget(
      ctx,
      (signal) =>
        c.partitionWaiter.waitFor(
          key,
          (o) => {
            if (!o || (o.metadata.generation ?? 0) < generation) return undefined;
            last = o;
            if (o.metadata.uid !== ref.uid || o.metadata.deletionTimestamp)
              throw aborted(`volume ${req.volumeId} went away while its limits were changed`);
            if (o.status?.state === "Failed")
              throw csiError("unavailable", `the agent cannot serve the volume: ${progressOf(o)}`);
            const applied = o.status?.qos;
            return applied && canonicalJson(applied) === canonicalJson(want) ? o : undefined;
          },
          signal,
        ),
      () =>
        `volume ${key} does not enforce ${canonicalJson(want)} yet (target reports ${canonicalJson(last?.status?.qos ?? null)}): ${progressOf(last)}`,
    );
    c.log.info("volume limits modified", { partition: key, ...want });
    return {};
  });
}
