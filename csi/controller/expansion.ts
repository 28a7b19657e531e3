// ControllerExpandVolume: grows the partition's spec.sizeBytes and waits until the agent has grown
// the lvol and re-exported it. Volumes never shrink; only the spdk backend grows in place.
import type { HandlerContext } from "@connectrpc/connect";
import type { NVMePartition } from "../../api/index.ts";
import type { ControllerExpandVolumeRequest } from "../../gen/csi/v1/csi_pb.ts";
import { aborted, csiError, failedPrecondition, invalidArgument, notFound } from "../errors.ts";
import { type NormalizedCapability, requireSupported } from "./capabilities.ts";
import { resolveCapacity } from "./capacity.ts";
import { reserveGrowth } from "./expansion-reservation.ts";
import { readRecord } from "./fingerprint.ts";
import type { ControllerState } from "./state.ts";
import { capacityOf, progressOf } from "./volume-view.ts";

/**
 * ControllerExpandVolume: answers the capacity once the exported volume holds at least the
 * requested size, and whether the node must grow a filesystem on it. Idempotent (a volume already
 * that large answers at once); OUT_OF_RANGE when it already exceeds limit_bytes, NOT_FOUND for a
 * gone volume, RESOURCE_EXHAUSTED when its drive's ledger has no room for the new size, FAILED_PRECONDITION for the kernel backend, ABORTED when the volume went away or
 * another call on it runs.
 */
export async function expandVolume(
  c: ControllerState,
  req: ControllerExpandVolumeRequest,
  ctx: HandlerContext,
) {
  if (!req.volumeId) throw invalidArgument("volume_id is required");
  const range = req.capacityRange;
  if (!range || (range.requiredBytes === 0n && range.limitBytes === 0n))
    throw invalidArgument("capacity_range with required_bytes or limit_bytes is required");
  let cap: NormalizedCapability | undefined;
  if (req.volumeCapability) [cap] = requireSupported([req.volumeCapability], "volume_capability");
  const target = resolveCapacity(range, 0);
  const ref = c.ref(req.volumeId);
  if (!ref) throw notFound(`volume ${req.volumeId} does not exist`);
  c.requireSynced();
  const key = c.key(ref.name);
  return c.inFlight.run(key, "ControllerExpandVolume", async () => {
    const p = await c.partitionOf(ref);
    if (!p || p.metadata.deletionTimestamp) throw notFound(`volume ${req.volumeId} does not exist`);
    const record = readRecord(p.metadata.annotations);
    // A filesystem must be grown by the node after the device grew; a raw block volume need not.
    const nodeExpansionRequired = cap
      ? cap.access === "mount"
      : (record?.capabilities.some((x) => x.access === "mount") ?? true);
    const current = capacityOf(p);
    if (target <= current && target <= p.spec.sizeBytes) {
      if (range.limitBytes > 0n && BigInt(current) > range.limitBytes)
        throw csiError(
          "out-of-range",
          `volume holds ${current} bytes, more than limit_bytes ${range.limitBytes}; volumes never shrink`,
        );
      return { capacityBytes: BigInt(current), nodeExpansionRequired };
    }
    if ((p.spec.backend ?? "spdk") !== "spdk") {
      throw failedPrecondition(
        `volume ${req.volumeId} uses the kernel backend, whose partitions cannot grow in place; only spdk volumes expand`,
      );
    }
    if ((p.spec.replicas ?? 1) > 1) {
      throw failedPrecondition(
        `volume ${req.volumeId} is replicated (${p.spec.replicas} copies): growing its copies and the raid over them together is not supported yet`,
      );
    }
    let patched = p;
    if (p.spec.sizeBytes < target) {
      // Room first: the spec grows only once the device's ledger holds the new size.
      await reserveGrowth(c, p, target);
      patched = await c.partClient.mergePatch(ref.name, c.ns, { spec: { sizeBytes: target } });
    }
    const generation = patched.metadata.generation ?? 0;
    let last: NVMePartition | undefined = patched;
    const grown = await c.budget(
      ctx,
      (signal) =>
        c.partitionWaiter.waitFor(
          key,
          (o) => {
            if (!o || (o.metadata.generation ?? 0) < generation) return undefined;
            last = o;
            if (o.metadata.uid !== ref.uid || o.metadata.deletionTimestamp)
              throw aborted(`volume ${req.volumeId} went away during expansion`);
            if (o.status?.state === "Failed")
              throw csiError("unavailable", `expansion failed: ${progressOf(o)}`);
            return o.status?.state === "Exported" && capacityOf(o) >= target ? o : undefined;
          },
          signal,
        ),
      () =>
        `volume ${key} has not grown to ${target} bytes yet (allocated ${last ? capacityOf(last) : "?"}): ${progressOf(last)}`,
    );
    c.log.info("volume expanded", { partition: key, bytes: capacityOf(grown) });
    return { capacityBytes: BigInt(capacityOf(grown)), nodeExpansionRequired };
  });
}
