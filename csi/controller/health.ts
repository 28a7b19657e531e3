// ControllerGetVolume, ControllerGetVolumeHealth and ControllerListVolumeHealth: a volume's state
// and its abnormal conditions (volume-view.ts judges the partition, storage-health.ts its storage
// node and drive) as CSI reports them.

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
import { DEFAULT_HEARTBEAT_STALENESS_MS, type StorageView, storageHealth } from "./storage-health.ts";
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

/**
 * ControllerGetVolumeHealth: the volume's abnormal conditions (none when healthy): the
 * partition's own, then its storage node's (agent heartbeat stale or record gone, not Ready) and
 * its drive's (gone from the inventory). NOT_FOUND when gone; UNAVAILABLE before the caches synced.
 */
export async function getVolumeHealth(c: ControllerState, req: ControllerGetVolumeHealthRequest) {
  if (!req.volumeId) throw invalidArgument("volume_id is required");
  const ref = c.ref(req.volumeId);
  const p = ref && (await c.partitionOf(ref));
  if (!p) throw notFound(`volume ${req.volumeId} does not exist`);
  c.requireSynced();
  return { volumeHealth: healthOf(p, c.ns, storageView(c)) };
}

/** ControllerListVolumeHealth: abnormal volumes only, as CSI asks; same keyset pagination as ListVolumes. */
export function listVolumeHealth(c: ControllerState, req: ControllerListVolumeHealthRequest) {
  c.requireSynced();
  const view = storageView(c);
  const abnormal = c.addressable().filter((p) => healthOf(p, c.ns, view).healthStatuses.length > 0);
  const page = paginate(abnormal, (p) => p.metadata.name, req.maxEntries, req.startingToken);
  return { entries: page.entries.map((p) => healthOf(p, c.ns, view)), nextToken: page.nextToken };
}

function storageView(c: ControllerState): StorageView {
  return {
    // The release's agents report in the release namespace; records elsewhere are not theirs.
    storageNodes: c.storageNodes.list().filter((n) => n.metadata.namespace === c.ns),
    devices: c.devices.list(),
    nowMs: c.o.clock.now(),
    stalenessMs: c.o.heartbeatStalenessMs ?? DEFAULT_HEARTBEAT_STALENESS_MS,
  };
}

/**
 * The CSI VolumeHealth of partition `p` in namespace `ns`: the partition's issues, and with
 * `storage` those of its storage node and drive. Pure.
 */
export function healthOf(p: NVMePartition, ns: string, storage?: StorageView) {
  const issues = [...volumeHealth(p), ...(storage ? storageHealth(p, storage) : [])];
  return {
    volumeId: formatVolumeId({ namespace: ns, name: p.metadata.name, uid: p.metadata.uid as string }),
    healthStatuses: issues.map((h) => ({
      status: VolumeHealthErrorType[h.status],
      reason: h.reason,
      message: h.message,
    })),
  };
}
