// Volumes left on a drive by partitions released while the drive (or its node) was lost: which of
// a returned drive's leftover ledger entries this agent deletes (marking and dropping entries are
// lib/device-ledger.ts's markLeftover and dropLeftover, shared with the manager). Pure.
import type { DeviceReservation, NVMeDevice } from "../../api/index.ts";
import type { BackendName } from "../backends/types.ts";

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
