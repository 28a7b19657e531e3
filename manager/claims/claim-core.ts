// Claim binding as pure functions: what to do for an NVMeDeviceClaim given the devices in view
// (bind by exact serial, hold or release on deletion, reclaim a vanished claim's device), and the
// device status that binding and release produce, decided on the device as read at write time.
import type {
  NVMeDevice,
  NVMeDeviceClaim,
  NVMeDeviceClaimStatus,
  NVMeDeviceStatus,
} from "../../api/index.ts";
import {
  type DeviceUsage,
  describeHolders,
  INITIAL_DEVICE_STATUS,
  ledgerOf,
} from "../../lib/device-ledger.ts";
import { findCondition } from "../../lib/kube/conditions.ts";
import { objectKey } from "../../lib/kube/resource.ts";
import type { StatusPatch } from "../status-patch.ts";
import { CLAIM_FINALIZER, ConditionTypes } from "../vocabulary.ts";

/** What claim binding reads. */
export interface ClaimView {
  devicesWithSerial(serial: string): NVMeDevice[];
  /** Devices whose status.claimRef names "ns/name", whatever the UID. */
  devicesClaimedAs(claimKey: string): NVMeDevice[];
  usage(device: NVMeDevice): DeviceUsage;
}

export type ClaimAction =
  | { type: "addFinalizer" }
  /** Record this claim as the device's owner (phase Claimed), unless another claim got there first. */
  | { type: "bind"; device: string }
  /** Drop ownership of `uid`, only if the device still names that UID and holds no partitions. */
  | { type: "release"; device: string; uid: string }
  /** Like release, after checking with the API server that no claim `claimKey` of `uid` exists. */
  | { type: "releaseOrphan"; device: string; claimKey: string; uid: string }
  | { type: "removeFinalizer" }
  | { type: "event"; eventType: "Normal" | "Warning"; reason: string; note: string };

export interface ClaimOutcome {
  actions: ClaimAction[];
  status?: StatusPatch<NVMeDeviceClaimStatus>;
}

export type BoundReason =
  | "DeviceBound"
  | "DeviceNotFound"
  | "DeviceLost"
  | "DeviceUnavailable"
  | "DeviceClaimedByOther"
  | "AmbiguousSerial"
  | "NodeMismatch";

export const INITIAL_CLAIM_STATUS: NVMeDeviceClaimStatus = { phase: "Pending", conditions: [] };

function byName(a: NVMeDevice, b: NVMeDevice): number {
  return a.metadata.name < b.metadata.name ? -1 : a.metadata.name > b.metadata.name ? 1 : 0;
}

/**
 * Decides what to do for a claim that exists. Not deleting: make sure the finalizer is on, then
 * keep or make the binding to the one device with the claim's exact serial (on spec.nodeName
 * when set); a device another live claim owns is never taken. Deleting: release the owned device
 * once no partition holds it, then drop the finalizer; until then Released=False says why.
 */
export function decideClaim(claim: NVMeDeviceClaim, view: ClaimView): ClaimOutcome {
  const uid = claim.metadata.uid ?? "";
  const key = objectKey(claim.metadata);
  const hasFinalizer = claim.metadata.finalizers?.includes(CLAIM_FINALIZER) ?? false;
  const owned = view
    .devicesClaimedAs(key)
    .filter((d) => d.status?.claimRef?.uid === uid)
    .sort(byName);

  if (claim.metadata.deletionTimestamp) {
    if (!hasFinalizer) return { actions: [] };
    const held = owned.map((d) => ({ d, holders: view.usage(d).holders })).filter((x) => x.holders.size > 0);
    if (held.length > 0) {
      const message = held
        .map(
          ({ d, holders }) =>
            `device ${d.metadata.name} still holds ${holders.size} partition(s): ${describeHolders(holders)}`,
        )
        .join("; ")
        .concat("; the device is released once they are deleted");
      const prev = findCondition(claim.status?.conditions ?? [], ConditionTypes.Released);
      return {
        actions:
          prev?.status === "False" && prev.message === message
            ? []
            : [{ type: "event", eventType: "Warning", reason: "ReleaseBlocked", note: message }],
        status: {
          conditions: [
            {
              type: ConditionTypes.Released,
              status: "False",
              reason: "PartitionsRemain",
              message,
              observedGeneration: claim.metadata.generation,
            },
          ],
        },
      };
    }
    const actions: ClaimAction[] = owned.map((d) => ({ type: "release", device: d.metadata.name, uid }));
    for (const d of owned) {
      actions.push({
        type: "event",
        eventType: "Normal",
        reason: "Released",
        note: `device ${d.metadata.name} (serial ${d.spec.serial}) released`,
      });
    }
    actions.push({ type: "removeFinalizer" });
    return { actions };
  }

  const actions: ClaimAction[] = hasFinalizer ? [] : [{ type: "addFinalizer" }];
  const bound = owned[0];
  if (bound) {
    if (bound.status?.phase !== "Claimed" && bound.status?.phase !== "Unavailable") {
      actions.push({ type: "bind", device: bound.metadata.name });
    }
    if (claim.spec.nodeName && claim.spec.nodeName !== bound.spec.nodeName) {
      return withStatus(
        claim,
        actions,
        "Bound",
        bound,
        "NodeMismatch",
        `bound device ${bound.metadata.name} is on node ${bound.spec.nodeName}, not spec.nodeName ${claim.spec.nodeName}; it stays claimed until this claim is deleted`,
      );
    }
    if (bound.status?.phase === "Unavailable") {
      return withStatus(
        claim,
        actions,
        "Lost",
        bound,
        "DeviceUnavailable",
        `bound device ${bound.metadata.name} is Unavailable (absent from the last scan of node ${bound.spec.nodeName})`,
      );
    }
    return withStatus(
      claim,
      actions,
      "Bound",
      bound,
      "DeviceBound",
      `bound to device ${bound.metadata.name} on node ${bound.spec.nodeName}`,
    );
  }

  const matches = view
    .devicesWithSerial(claim.spec.serial)
    .filter((d) => !claim.spec.nodeName || d.spec.nodeName === claim.spec.nodeName)
    .sort(byName);
  const where = claim.spec.nodeName ? ` on node ${claim.spec.nodeName}` : "";
  if (matches.length === 0) {
    const lost = claim.status?.deviceName !== undefined && claim.status.phase !== "Pending";
    return lost
      ? withStatus(
          claim,
          actions,
          "Lost",
          undefined,
          "DeviceLost",
          `device ${claim.status?.deviceName} with serial ${claim.spec.serial} no longer exists`,
        )
      : withStatus(
          claim,
          actions,
          "Pending",
          undefined,
          "DeviceNotFound",
          `no NVMeDevice with serial ${claim.spec.serial}${where}`,
        );
  }
  if (matches.length > 1) {
    const nodes = matches.map((d) => d.spec.nodeName).join(", ");
    return withStatus(
      claim,
      actions,
      "Pending",
      undefined,
      "AmbiguousSerial",
      `serial ${claim.spec.serial} is reported by devices on nodes ${nodes}; set spec.nodeName to choose one`,
    );
  }
  const d = matches[0]!;
  const ref = d.status?.claimRef;
  if (ref) {
    const refKey = objectKey(ref);
    if (refKey === key) {
      // The device names an earlier claim of this same name: that one is gone (one name, one
      // object), unless this cache is behind; the controller checks with the API server.
      actions.push({ type: "releaseOrphan", device: d.metadata.name, claimKey: key, uid: ref.uid });
      return withStatus(
        claim,
        actions,
        "Pending",
        undefined,
        "DeviceClaimedByOther",
        `device ${d.metadata.name} is held by an earlier claim ${refKey} (uid ${ref.uid}); reclaiming it`,
      );
    }
    return withStatus(
      claim,
      actions,
      "Pending",
      undefined,
      "DeviceClaimedByOther",
      `device ${d.metadata.name} is already claimed by ${refKey}`,
    );
  }
  if (d.status?.phase === "Unavailable") {
    return withStatus(
      claim,
      actions,
      "Pending",
      undefined,
      "DeviceUnavailable",
      `device ${d.metadata.name} is Unavailable (absent from the last scan of node ${d.spec.nodeName})`,
    );
  }
  actions.push({ type: "bind", device: d.metadata.name });
  return withStatus(
    claim,
    actions,
    "Bound",
    d,
    "DeviceBound",
    `bound to device ${d.metadata.name} on node ${d.spec.nodeName}`,
  );
}

/**
 * For a claim key with no claim in the cache: every device still naming that key is reclaimed
 * (after the controller confirms with the API server that the named UID is gone).
 */
export function decideMissingClaim(claimKey: string, view: ClaimView): ClaimOutcome {
  return {
    actions: view.devicesClaimedAs(claimKey).map((d) => ({
      type: "releaseOrphan" as const,
      device: d.metadata.name,
      claimKey,
      uid: d.status?.claimRef?.uid ?? "",
    })),
  };
}

function withStatus(
  claim: NVMeDeviceClaim,
  actions: ClaimAction[],
  phase: NVMeDeviceClaimStatus["phase"],
  device: NVMeDevice | undefined,
  reason: BoundReason,
  message: string,
): ClaimOutcome {
  const generation = claim.metadata.generation;
  const ok = reason === "DeviceBound";
  const prev = findCondition(claim.status?.conditions ?? [], ConditionTypes.Bound);
  if (prev?.reason !== reason || prev.message !== message) {
    actions.push({
      type: "event",
      eventType: ok ? "Normal" : "Warning",
      reason: ok ? "Bound" : reason,
      note: message,
    });
  }
  const keepDevice = phase === "Lost" && !device;
  return {
    actions,
    status: {
      set: {
        phase,
        deviceName: device?.metadata.name ?? (keepDevice ? claim.status?.deviceName : undefined),
        nodeName: device?.spec.nodeName ?? (keepDevice ? claim.status?.nodeName : undefined),
        observedGeneration: generation,
      },
      conditions: [
        {
          type: ConditionTypes.Bound,
          status: ok ? "True" : "False",
          reason,
          message,
          observedGeneration: generation,
        },
      ],
    },
  };
}

export type BindResult = { ok: true; status: NVMeDeviceStatus } | { ok: false; message: string };

/**
 * The device status after binding `claim`, decided on the device as read at write time: refused
 * when another UID owns it or it is Unavailable without an owner. Idempotent.
 */
export function bindDeviceStatus(device: NVMeDevice, claim: NVMeDeviceClaim): BindResult {
  const status = device.status ?? INITIAL_DEVICE_STATUS;
  const ref = status.claimRef;
  const uid = claim.metadata.uid ?? "";
  if (ref && ref.uid !== uid) {
    return {
      ok: false,
      message: `device ${device.metadata.name} is claimed by ${ref.namespace}/${ref.name} (uid ${ref.uid})`,
    };
  }
  if (!ref && status.phase === "Unavailable") {
    return { ok: false, message: `device ${device.metadata.name} is Unavailable` };
  }
  return {
    ok: true,
    status: {
      ...status,
      phase: status.phase === "Unavailable" ? "Unavailable" : "Claimed",
      claimRef: { namespace: claim.metadata.namespace ?? "", name: claim.metadata.name, uid },
    },
  };
}

export type ReleaseResult =
  | { kind: "release"; status: NVMeDeviceStatus }
  /** The device names another UID (or none): a replacement claim is never released by an old one. */
  | { kind: "not-owner" }
  | { kind: "held"; message: string };

/**
 * The device status after `uid` gives the device up, decided on the device as read at write time.
 * Every partition placed on the device has a ledger entry written before its placement, so an
 * empty ledger in this read proves nothing is placed there.
 */
export function releaseDeviceStatus(device: NVMeDevice, uid: string): ReleaseResult {
  const status = device.status;
  if (!status?.claimRef || status.claimRef.uid !== uid) return { kind: "not-owner" };
  const ledger = ledgerOf(device);
  if (ledger.length > 0) {
    return {
      kind: "held",
      message: `device ${device.metadata.name} holds ${ledger.length} partition(s): ${ledger
        .slice(0, 5)
        .map((r) => `${r.namespace}/${r.name}`)
        .join(", ")}`,
    };
  }
  const { claimRef: _dropped, ...rest } = status;
  return {
    kind: "release",
    status: { ...rest, phase: status.phase === "Unavailable" ? "Unavailable" : "Available" },
  };
}
