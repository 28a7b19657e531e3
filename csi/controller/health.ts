// ControllerGetVolume, ControllerGetVolumeHealth and ControllerListVolumeHealth: a volume's state
// and its abnormal conditions (volume-view.ts judges them) as CSI reports them.

import type { NVMePartition } from "../../api/index.ts";
import type {
  ControllerGetVolumeHealthRequest,
  ControllerGetVolumeRequest,
  ControllerListVolumeHealthRequest,
} from "../../gen/csi/v1/csi_pb.ts";
import { VolumeHealthErrorType } from "../../gen/csi/v1/csi_pb.ts";
import { paginate } from "../../lib/keyset-pagination.ts";
import { invalidArgument, notFound } from "../errors.ts";
import type { ControllerState } from "./state.ts";
import { formatVolumeId } from "./volume-id.ts";
import { volumeHealth } from "./volume-view.ts";

/**
 * ControllerGetVolume: the volume as the API server has it now, with the nodes the cache shows it
 * published to. NOT_FOUND for a gone volume; UNAVAILABLE before the caches synced.
 */
export async function getVolume(c: ControllerState, req: ControllerGetVolumeRequest) {
  if (!req.volumeId) throw invalidArgument("volume_id is required");
  const ref = c.ref(req.volumeId);
  const p = ref && (await c.partitionOf(ref));
  if (!p) throw notFound(`volume ${req.volumeId} does not exist`);
  c.requireSynced();
  return {
    volume: c.volumeOf(p),
    status: { publishedNodeIds: c.publishedNodes().get(p.metadata.uid as string) ?? [] },
  };
}

/** ControllerGetVolumeHealth: the volume's abnormal conditions (none when healthy). NOT_FOUND when gone. */
export async function getVolumeHealth(c: ControllerState, req: ControllerGetVolumeHealthRequest) {
  if (!req.volumeId) throw invalidArgument("volume_id is required");
  const ref = c.ref(req.volumeId);
  const p = ref && (await c.partitionOf(ref));
  if (!p) throw notFound(`volume ${req.volumeId} does not exist`);
  return { volumeHealth: healthOf(p, c.ns) };
}

/** ControllerListVolumeHealth: abnormal volumes only, as CSI asks; same keyset pagination as ListVolumes. */
export function listVolumeHealth(c: ControllerState, req: ControllerListVolumeHealthRequest) {
  c.requireSynced();
  const abnormal = c.addressable().filter((p) => volumeHealth(p).length > 0);
  const page = paginate(abnormal, (p) => p.metadata.name, req.maxEntries, req.startingToken);
  return { entries: page.entries.map((p) => healthOf(p, c.ns)), nextToken: page.nextToken };
}

/** The CSI VolumeHealth of partition `p` in namespace `ns`. Pure. */
export function healthOf(p: NVMePartition, ns: string) {
  return {
    volumeId: formatVolumeId({ namespace: ns, name: p.metadata.name, uid: p.metadata.uid as string }),
    healthStatuses: volumeHealth(p).map((h) => ({
      status: VolumeHealthErrorType[h.status],
      reason: h.reason,
      message: h.message,
    })),
  };
}
