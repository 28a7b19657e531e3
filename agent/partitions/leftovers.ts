// Volumes left on a drive by partitions released while the drive (or its node) was lost, as pure
// functions over the drive's ledger: marking an entry leftover before its partition lets go,
// which of a returned drive's leftovers this agent deletes, and dropping an entry once done.
import type { DeviceReservation, Leftover, NVMeDevice, NVMeDeviceStatus } from "../../api/index.ts";
import type { BackendName } from "../backends/types.ts";

/**
 * The status of `latest` with the ledger entry of partition `uid` marked leftover, or undefined
 * when there is nothing to write: no such entry (nothing holds room for it, so nothing is to be
 * kept) or one already marked (its first `since` stands). Pure.
 */
export function markLeftover(
  latest: NVMeDevice,
  uid: string,
  leftover: Leftover,
): NVMeDeviceStatus | undefined {
  const s = latest.status;
  const entry = s?.reservations?.find((r) => r.uid === uid);
  if (!s || !entry || entry.leftover) return undefined;
  return {
    ...s,
    reservations: (s.reservations ?? []).map((r) => (r.uid === uid ? { ...r, leftover } : r)),
  };
}

/**
 * The status of `latest` without partition `uid`'s leftover entry, or undefined when it holds no
 * leftover entry of that UID (an entry that is not a leftover belongs to a live partition and is
 * never touched here). The manager's capacity reconciler recomputes freeBytes from what remains.
 */
export function dropLeftover(latest: NVMeDevice, uid: string): NVMeDeviceStatus | undefined {
  const s = latest.status;
  if (!s?.reservations?.some((r) => r.uid === uid && r.leftover)) return undefined;
  return { ...s, reservations: s.reservations.filter((r) => !(r.uid === uid && r.leftover)) };
}

export interface LeftoverPlan {
  device: NVMeDevice;
  /**
   * The backend the drive is locked to, whose volume manager holds the leftovers; undefined when
   * the drive was never locked, so no volume can have been made on it and the entries only go.
   */
  backend?: BackendName;
  entries: DeviceReservation[];
}

/**
 * What this agent cleans on `device`: its leftover entries, once the drive is back on this node
 * (phase not Unavailable and its Present condition True, i.e. a complete scan found it again).
 * Undefined while there is nothing to do. A drive that never returns keeps its entries until an
 * operator deletes its NVMeDevice; a drive replaced by another (a new serial) is another device.
 */
export function leftoversToClean(device: NVMeDevice | undefined, nodeName: string): LeftoverPlan | undefined {
  if (!device || device.spec.nodeName !== nodeName) return undefined;
  const s = device.status;
  const entries = (s?.reservations ?? []).filter((r) => r.leftover);
  if (entries.length === 0 || s?.phase === "Unavailable") return undefined;
  const present = s?.conditions?.find((c) => c.type === "Present");
  if (present?.status !== "True") return undefined;
  return { device, ...(s?.activeBackend ? { backend: s.activeBackend } : {}), entries };
}
