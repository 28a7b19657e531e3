// Which NVMeDevice updates can change a partition reconcile's outcome. The manager rewrites a
// drive's placement ledger (status.reservations, status.freeBytes) on every placement; requeueing
// every partition on the drive for those would re-check all existing volumes per new one.
import type { NVMeDevice } from "../../api/index.ts";

/**
 * Whether an update from `old` to `next` touches a field the partition reconciler reads (decide()
 * plus the controller's device lookup, lock and deprovision paths): the drive's identity (name,
 * serial, node, PCI address) and its phase, owning claim and active backend. Anything else, the
 * ledger above all, cannot change a decision. A missing side (add or delete) always matters.
 */
export function deviceChangeMatters(old: NVMeDevice | undefined, next: NVMeDevice | undefined): boolean {
  if (!old || !next) return true;
  return (
    old.metadata.name !== next.metadata.name ||
    old.metadata.uid !== next.metadata.uid ||
    old.spec.serial !== next.spec.serial ||
    old.spec.nodeName !== next.spec.nodeName ||
    old.spec.pciAddress !== next.spec.pciAddress ||
    old.status?.phase !== next.status?.phase ||
    old.status?.activeBackend !== next.status?.activeBackend ||
    !sameClaim(old.status?.claimRef, next.status?.claimRef)
  );
}

type ClaimRef = NonNullable<NVMeDevice["status"]>["claimRef"];

function sameClaim(a: ClaimRef, b: ClaimRef): boolean {
  if (!a || !b) return a === b;
  return a.uid === b.uid && a.name === b.name && a.namespace === b.namespace;
}
