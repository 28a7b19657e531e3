// GetCapacity, ListVolumes, ListSnapshots and GetSnapshot: answers read from the watch caches alone
// (never the API server), UNAVAILABLE until they have synced; listings page by object name.
import type {
  GetCapacityRequest,
  GetSnapshotRequest,
  ListSnapshotsRequest,
  ListVolumesRequest,
} from "../../gen/csi/v1/csi_pb.ts";
import { paginate } from "../../lib/keyset-pagination.ts";
import { ALLOCATION_UNIT } from "../../lib/units.ts";
import { invalidArgument, notFound } from "../errors.ts";
import { malformedReason, unsupportedReason } from "./capabilities.ts";
import { availableCapacity } from "./capacity-report.ts";
import { parseParameters } from "./parameters.ts";
import { snapshotInfo } from "./snapshots.ts";
import type { ControllerState } from "./state.ts";
import { parseVolumeId } from "./volume-id.ts";

/** ListVolumes: every addressable volume with the nodes it is published to, one page at a time. */
export function listVolumes(c: ControllerState, req: ListVolumesRequest) {
  c.requireSynced();
  const published = c.publishedNodes();
  const page = paginate(c.addressable(), (p) => p.metadata.name, req.maxEntries, req.startingToken);
  return {
    entries: page.entries.map((p) => ({
      volume: c.volumeOf(p),
      status: { publishedNodeIds: published.get(p.metadata.uid as string) ?? [] },
    })),
    nextToken: page.nextToken,
  };
}

/**
 * GetCapacity: what a new volume of the class (its backend) in the requested topology segment
 * could really get, i.e. the free room of the single best device there, rounded down to the
 * allocation unit. available_capacity and maximum_volume_size both carry it: the external-
 * provisioner publishes them per segment as CSIStorageCapacity, and kube-scheduler compares a
 * claim with maximumVolumeSize (else capacity), so a sum over devices would send a claim to a
 * segment where no device can hold it. Zero for capabilities DISTORT cannot provide;
 * INVALID_ARGUMENT for malformed capabilities or parameters.
 */
export function getCapacity(c: ControllerState, req: GetCapacityRequest) {
  const { params } = parseParameters(req.parameters, c.ns);
  for (const [i, cap] of req.volumeCapabilities.entries()) {
    const why = malformedReason(cap);
    if (why) throw invalidArgument(`volume_capabilities[${i}]: ${why}`);
    // Capacity for volumes DISTORT cannot make is none at all.
    if (unsupportedReason(cap)) return { availableCapacity: 0n };
  }
  c.requireSynced();
  const answer = availableCapacity(c.devices.list(), c.storageNodes.list(), {
    backend: params.backend,
    ...(req.accessibleTopology ? { segments: req.accessibleTopology.segments } : {}),
  });
  return {
    availableCapacity: BigInt(answer.largestVolumeBytes),
    maximumVolumeSize: BigInt(answer.largestVolumeBytes),
    minimumVolumeSize: BigInt(ALLOCATION_UNIT),
  };
}

/**
 * ListSnapshots: snapshots not being deleted, filtered by snapshot id or source volume id when
 * given (an id that is not ours matches nothing), one page at a time.
 */
export function listSnapshots(c: ControllerState, req: ListSnapshotsRequest) {
  c.requireSynced();
  let items = liveSnapshots(c);
  if (req.snapshotId) {
    const ref = c.ref(req.snapshotId);
    items = ref ? items.filter((s) => s.metadata.name === ref.name && s.metadata.uid === ref.uid) : [];
  }
  if (req.sourceVolumeId)
    items = items.filter((s) => snapshotInfo(s, c.ns).sourceVolumeId === req.sourceVolumeId);
  const page = paginate(items, (s) => s.metadata.name, req.maxEntries, req.startingToken);
  return {
    entries: page.entries.map((s) => ({ snapshot: snapshotInfo(s, c.ns) })),
    nextToken: page.nextToken,
  };
}

/**
 * GetSnapshot: the one snapshot with that id, as ListSnapshots would list it. INVALID_ARGUMENT
 * without an id; NOT_FOUND for an id that is not ours, names no cached snapshot (or one of another
 * uid, i.e. a snapshot deleted and made again under the same name), or one being deleted.
 */
export function getSnapshot(c: ControllerState, req: GetSnapshotRequest) {
  if (!req.snapshotId) throw invalidArgument("snapshot_id is required");
  c.requireSynced();
  const ref = c.ref(req.snapshotId);
  const s = ref && liveSnapshots(c).find((x) => x.metadata.name === ref.name && x.metadata.uid === ref.uid);
  if (!s) throw notFound(`snapshot ${req.snapshotId} does not exist`);
  return { snapshot: snapshotInfo(s, c.ns) };
}

/** Cached snapshots not being deleted whose name and uid make a valid snapshot id. */
function liveSnapshots(c: ControllerState) {
  return c.snapshots.list().filter((s) => {
    const uid = s.metadata.uid;
    return (
      uid !== undefined &&
      !s.metadata.deletionTimestamp &&
      parseVolumeId(`${c.ns}/${s.metadata.name}/${uid}`) !== undefined
    );
  });
}
