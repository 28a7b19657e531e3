// Whether a device is owned by a live, bound claim: the device's status.claimRef names the claim's
// exact UID, the claim is not being deleted, and it is bound to this device by serial (and node).
// Pure; placement runs it on cached objects to choose and on fresh reads to reserve.
import type { ClaimRef, NVMeDevice, NVMeDeviceClaim } from "../api/index.ts";
import { objectKey } from "../lib/kube/resource.ts";

export type OwnerProblem =
  | "Unclaimed"
  | "DeviceUnavailable"
  | "ClaimMissing"
  | "ClaimDeleting"
  | "ClaimNotBound"
  | "ClaimMismatch";

export type Ownership =
  | { ok: true; claimRef: ClaimRef }
  | { ok: false; problem: OwnerProblem; message: string };

/** "ns/name" of the claim a device's status names, or undefined when unclaimed. */
export function claimKeyOf(device: NVMeDevice): string | undefined {
  const ref = device.status?.claimRef;
  return ref ? objectKey(ref) : undefined;
}

/**
 * Checks that `claim` (looked up by the device's claimRef namespace/name) is the device's live
 * owner. `claim` undefined means no object of that name exists.
 */
export function verifyOwner(device: NVMeDevice, claim: NVMeDeviceClaim | undefined): Ownership {
  const dev = device.metadata.name;
  const ref = device.status?.claimRef;
  if (device.status?.phase === "Unavailable") {
    return { ok: false, problem: "DeviceUnavailable", message: `device ${dev} is Unavailable` };
  }
  if (device.status?.phase !== "Claimed" || !ref) {
    return { ok: false, problem: "Unclaimed", message: `device ${dev} is not claimed` };
  }
  const who = `${ref.namespace}/${ref.name}`;
  if (!claim || claim.metadata.uid !== ref.uid) {
    return {
      ok: false,
      problem: "ClaimMissing",
      message: `claim ${who} (uid ${ref.uid}) of device ${dev} no longer exists`,
    };
  }
  if (claim.metadata.deletionTimestamp) {
    return { ok: false, problem: "ClaimDeleting", message: `claim ${who} of device ${dev} is being deleted` };
  }
  if (
    claim.spec.serial !== device.spec.serial ||
    (claim.spec.nodeName && claim.spec.nodeName !== device.spec.nodeName)
  ) {
    return { ok: false, problem: "ClaimMismatch", message: `claim ${who} does not select device ${dev}` };
  }
  if (claim.status?.phase !== "Bound" || claim.status.deviceName !== dev) {
    return { ok: false, problem: "ClaimNotBound", message: `claim ${who} is not yet Bound to device ${dev}` };
  }
  return { ok: true, claimRef: { namespace: ref.namespace, name: ref.name, uid: ref.uid } };
}
