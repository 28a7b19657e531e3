// The CSI SnapshotMetadata service (changed-block tracking): which clusters a snapshot holds data
// in, and which changed between two snapshots of one volume. Answered from the records the agent
// keeps in NVMeSnapshot.status.blockMetadata (agent/snapshots/controller.ts): each snapshot's own
// clusters, those written since its parent snapshot. Allocated(B) is the union of the records from
// B up to the root of its lineage; Delta(A, B) the union of those after A up to B. A lineage with
// a missing or unread record is refused (UNAVAILABLE), never answered with fewer clusters.
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { HandlerContext } from "@connectrpc/connect";
import { type NVMeSnapshot, NVMeSnapshotConditionTypes } from "../../api/index.ts";
import {
  BlockMetadataType,
  type GetMetadataAllocatedRequest,
  type GetMetadataAllocatedResponseSchema,
  type GetMetadataDeltaRequest,
  type GetMetadataDeltaResponseSchema,
} from "../../gen/csi/v1/csi_pb.ts";
import { decodeClusterMap, unionClusters } from "../../lib/cluster-map.ts";
import { csiError, invalidArgument, notFound } from "../errors.ts";
import type { ControllerState } from "./state.ts";

/** Tuples per streamed message when the caller leaves max_results at 0. */
export const DEFAULT_TUPLES_PER_MESSAGE = 1024;

/** One snapshot's record, decoded. */
export interface SnapshotRecord {
  name: string;
  clusterSizeBytes: number;
  numClusters: number;
  clusters: number[];
  parentSnapshot: string | undefined;
}

/** What the answer is computed from: the snapshots of the driver namespace, by name. */
export type SnapshotsByName = ReadonlyMap<string, NVMeSnapshot>;

function describe(s: NVMeSnapshot): string {
  return `${s.metadata.namespace}/${s.metadata.name}`;
}

/**
 * The decoded record of `s`. UNAVAILABLE while the agent has not read it (or dropped it as stale);
 * FAILED_PRECONDITION for a snapshot that can have none (not ready, refused). Pure.
 */
export function recordOf(s: NVMeSnapshot): SnapshotRecord {
  if (!s.status?.readyToUse) throw csiError("precondition", `snapshot ${describe(s)} is not ready to use`);
  const cond = s.status.conditions?.find((c) => c.type === NVMeSnapshotConditionTypes.BlockMetadata);
  const rec = s.status.blockMetadata;
  if (!rec || cond?.status !== "True")
    throw csiError(
      "unavailable",
      `the changed-block record of snapshot ${describe(s)} is not read yet${cond?.message ? ` (${cond.reason}: ${cond.message})` : ""}`,
    );
  let clusters: number[];
  try {
    clusters = decodeClusterMap(rec.clusters, rec.numClusters);
  } catch (err) {
    throw csiError(
      "internal",
      `the changed-block record of snapshot ${describe(s)} is damaged: ${(err as Error).message}`,
    );
  }
  return {
    name: s.metadata.name,
    clusterSizeBytes: rec.clusterSizeBytes,
    numClusters: rec.numClusters,
    clusters,
    parentSnapshot: rec.parentSnapshot,
  };
}

/**
 * The lineage of `target`: its record, then its parent snapshot's, up to the root (or up to and
 * excluding `stopAt`, the externalId of a base). Parents are matched by externalId on the same
 * drive. A parent that has no NVMeSnapshot (deleted: the agent is folding it into its child)
 * or no record is UNAVAILABLE. Pure.
 */
export function lineage(target: NVMeSnapshot, all: SnapshotsByName, stopAt?: string): SnapshotRecord[] {
  const byExternal = new Map<string, NVMeSnapshot>();
  for (const s of all.values())
    if (s.status?.externalId && s.status.deviceSerial === target.status?.deviceSerial)
      byExternal.set(s.status.externalId, s);
  const out: SnapshotRecord[] = [];
  const seen = new Set<string>();
  for (let cur: NVMeSnapshot | undefined = target; cur; ) {
    const r = recordOf(cur);
    out.push(r);
    seen.add(cur.metadata.name);
    const parent = r.parentSnapshot;
    if (parent === undefined) {
      if (stopAt !== undefined)
        throw invalidArgument(
          `base snapshot ${stopAt} is not an earlier snapshot of the volume of snapshot ${describe(target)}`,
        );
      break;
    }
    if (parent === stopAt) break;
    const next = byExternal.get(parent);
    // A parent being deleted still holds its record until its finalizer goes; the union with
    // a child that already took its clusters over is the same set.
    if (!next)
      throw csiError(
        "unavailable",
        `snapshot ${describe(cur)} was taken after lvol ${parent}, which is being merged into it; retry shortly`,
      );
    if (seen.has(next.metadata.name))
      throw csiError("internal", `the snapshot records around ${describe(target)} form a cycle`);
    cur = next;
  }
  const size = out[0]?.clusterSizeBytes;
  if (out.some((r) => r.clusterSizeBytes !== size))
    throw csiError("internal", `the snapshot records of ${describe(target)} disagree on the cluster size`);
  return out;
}

export interface ClusterAnswer {
  clusterSizeBytes: number;
  capacityBytes: number;
  clusters: number[];
}

/** Clusters holding data in `target` (GetMetadataAllocated). Pure. */
export function allocatedAnswer(target: NVMeSnapshot, all: SnapshotsByName): ClusterAnswer {
  const chain = lineage(target, all);
  const head = chain[0] as SnapshotRecord;
  return {
    clusterSizeBytes: head.clusterSizeBytes,
    capacityBytes: target.status?.sizeBytes ?? head.numClusters * head.clusterSizeBytes,
    clusters: unionClusters(chain.map((r) => r.clusters)),
  };
}

/**
 * Clusters written after `base` up to `target` (GetMetadataDelta). INVALID_ARGUMENT when `base`
 * is not an earlier snapshot of the target's lineage, or is the target itself. Pure.
 */
export function deltaAnswer(base: NVMeSnapshot, target: NVMeSnapshot, all: SnapshotsByName): ClusterAnswer {
  const baseId = base.status?.externalId;
  if (base.metadata.uid === target.metadata.uid)
    throw invalidArgument("base_snapshot_id and target_snapshot_id name the same snapshot");
  if (!baseId || base.status?.deviceSerial !== target.status?.deviceSerial)
    throw invalidArgument(
      `snapshot ${describe(base)} is not an earlier snapshot of the volume of ${describe(target)}`,
    );
  recordOf(base);
  const chain = lineage(target, all, baseId);
  const head = chain[0] as SnapshotRecord;
  return {
    clusterSizeBytes: head.clusterSizeBytes,
    capacityBytes: target.status?.sizeBytes ?? head.numClusters * head.clusterSizeBytes,
    clusters: unionClusters(chain.map((r) => r.clusters)),
  };
}

/** One streamed message of either RPC (their responses have the same fields). */
export interface MetadataPage {
  blockMetadataType: BlockMetadataType;
  volumeCapacityBytes: bigint;
  blockMetadata: { byteOffset: bigint; sizeBytes: bigint }[];
}

/**
 * The answer as streamed messages: FIXED_LENGTH tuples of one cluster each, none ending at or
 * before `startingOffset`, at most `perMessage` per message. OUT_OF_RANGE for an offset outside
 * the volume. At least one message even when nothing is allocated. Pure.
 */
export function messages(a: ClusterAnswer, startingOffset: bigint, maxResults: number): MetadataPage[] {
  if (maxResults < 0) throw invalidArgument(`max_results ${maxResults} is negative`);
  if (startingOffset < 0n || startingOffset >= BigInt(Math.max(a.capacityBytes, 1)))
    throw csiError(
      "out-of-range",
      `starting_offset ${startingOffset} is outside the ${a.capacityBytes}-byte volume`,
    );
  const per = maxResults === 0 ? DEFAULT_TUPLES_PER_MESSAGE : maxResults;
  const size = BigInt(a.clusterSizeBytes);
  const tuples: { byteOffset: bigint; sizeBytes: bigint }[] = [];
  for (const c of a.clusters) {
    const off = BigInt(c) * size;
    if (off + size <= startingOffset) continue;
    tuples.push({ byteOffset: off, sizeBytes: size });
  }
  const out: MetadataPage[] = [];
  const base = {
    blockMetadataType: BlockMetadataType.FIXED_LENGTH,
    volumeCapacityBytes: BigInt(a.capacityBytes),
  };
  for (let i = 0; i < tuples.length; i += per) out.push({ ...base, blockMetadata: tuples.slice(i, i + per) });
  if (out.length === 0) out.push({ ...base, blockMetadata: [] });
  return out;
}

async function snapshotFor(c: ControllerState, id: string, field: string): Promise<NVMeSnapshot> {
  if (!id) throw invalidArgument(`${field} is required`);
  const ref = c.ref(id);
  if (!ref) throw notFound(`${field} ${id} is not a snapshot of this driver`);
  c.requireSynced();
  const s = await c.snapshotOf(ref);
  if (!s || s.metadata.deletionTimestamp) throw notFound(`snapshot ${id} does not exist`);
  return s;
}

function byName(c: ControllerState): Map<string, NVMeSnapshot> {
  return new Map(c.snapshots.list().map((s) => [s.metadata.name, s]));
}

/** GetMetadataAllocated: every cluster holding data in the snapshot. */
export async function* getMetadataAllocated(
  c: ControllerState,
  req: GetMetadataAllocatedRequest,
  _ctx: HandlerContext,
): AsyncGenerator<MessageInitShape<typeof GetMetadataAllocatedResponseSchema>> {
  const target = await snapshotFor(c, req.snapshotId, "snapshot_id");
  const all = byName(c);
  all.set(target.metadata.name, target);
  const msgs = messages(allocatedAnswer(target, all), req.startingOffset, req.maxResults);
  c.log.info("snapshot allocation listed", {
    snapshot: c.key(target.metadata.name),
    tuples: msgs.reduce((n, m) => n + (m.blockMetadata?.length ?? 0), 0),
  });
  yield* msgs;
}

/** GetMetadataDelta: every cluster written after the base snapshot up to the target. */
export async function* getMetadataDelta(
  c: ControllerState,
  req: GetMetadataDeltaRequest,
  _ctx: HandlerContext,
): AsyncGenerator<MessageInitShape<typeof GetMetadataDeltaResponseSchema>> {
  const base = await snapshotFor(c, req.baseSnapshotId, "base_snapshot_id");
  const target = await snapshotFor(c, req.targetSnapshotId, "target_snapshot_id");
  const all = byName(c);
  all.set(target.metadata.name, target);
  all.set(base.metadata.name, base);
  const msgs = messages(deltaAnswer(base, target, all), req.startingOffset, req.maxResults);
  c.log.info("snapshot delta listed", {
    base: c.key(base.metadata.name),
    target: c.key(target.metadata.name),
    tuples: msgs.reduce((n, m) => n + (m.blockMetadata?.length ?? 0), 0),
  });
  yield* msgs;
}
