// The ledger step of ControllerExpandVolume: before a placed partition's spec grows, its entry in
// its device's reservation ledger (NVMeDevice.status.reservations, the manager's placement
// ledger) is raised to the new size by a resourceVersion-guarded status write.
import type { NVMePartition } from "../../api/index.ts";
import { kinds } from "../../api/index.ts";
import { type GrowVerdict, growVerdict, type PartitionUse, partitionUse } from "../../lib/device-ledger.ts";
import { ResourceClient } from "../../lib/kube/resource.ts";
import { updateStatus } from "../../lib/kube/status.ts";
import { roundUpToUnit } from "../../lib/units.ts";
import { csiError } from "../errors.ts";
import type { ControllerState } from "./state.ts";

/**
 * Reserves `bytes` (rounded up to the allocation unit) for partition `p` on its device, or throws
 * RESOURCE_EXHAUSTED when the device cannot hold it next to everything else it holds, and
 * UNAVAILABLE while the device is not known. An unplaced partition needs nothing: placement
 * reserves the size it reads. Idempotent: an entry already that large is left alone. Two calls
 * for different partitions on one device race on the device's resourceVersion; the loser
 * re-reads and decides on the winner's ledger.
 */
export async function reserveGrowth(c: ControllerState, p: NVMePartition, bytes: number): Promise<void> {
  const { nodeName, deviceSerial } = p.spec;
  if (!nodeName || !deviceSerial) return;
  const device = c.devices.list().find((d) => d.spec.nodeName === nodeName && d.spec.serial === deviceSerial);
  if (!device)
    throw csiError(
      "unavailable",
      `device ${deviceSerial} on node ${nodeName} is not known; cannot reserve room to grow`,
    );
  const use = partitionUse(p) as PartitionUse;
  const wanted: PartitionUse = { ...use, bytes: roundUpToUnit(bytes) };
  const placed = c.partitions
    .list()
    .filter((x) => x.spec.nodeName === nodeName && x.spec.deviceSerial === deviceSerial)
    .flatMap((x) => {
      const u = partitionUse(x);
      return u ? [u] : [];
    });
  let verdict: GrowVerdict = { kind: "held" };
  await updateStatus(
    new ResourceClient(c.o.conn, kinds.NVMeDevice),
    device.metadata.name,
    undefined,
    (latest) => {
      verdict = growVerdict(latest, placed, wanted);
      return verdict.kind === "write" ? verdict.status : undefined;
    },
  );
  const v = verdict as GrowVerdict;
  if (v.kind === "reject")
    throw csiError("exhausted", `cannot grow volume ${c.key(p.metadata.name)}: ${v.message}`);
  if (v.kind === "write")
    c.log.info("expansion reserved in the device ledger", {
      partition: c.key(p.metadata.name),
      bytes: wanted.bytes,
    });
}
