// What the CSI controller caches: its one cache per kind, with the transform that drops the device
// fields no Controller RPC reads.
import { kinds } from "../api/index.ts";
import type { ObjectTransform } from "../lib/kube/cache-set.ts";
import type { KubeObject } from "../lib/kube/resource.ts";

type DeviceLike = KubeObject & {
  status?: { freeBytes?: number; reservations?: unknown; conditions?: unknown };
};

/**
 * NVMeDevice: its conditions, and its placement ledger (status.reservations) once the manager has
 * published status.freeBytes, the figure GetCapacity uses in its place. The CSI controller never
 * writes a device. Every other kind is kept whole: CreateVolume's idempotency reads partition
 * annotations, and the RPCs read partition, attachment and snapshot conditions.
 */
export const csiTransform: ObjectTransform = (kind, obj) => {
  if (kind.kind !== kinds.NVMeDevice.kind) return obj;
  const s = (obj as DeviceLike).status;
  if (!s) return obj;
  delete s.conditions;
  if (s.freeBytes !== undefined) delete s.reservations;
  return obj;
};
