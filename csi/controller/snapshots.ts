// CreateSnapshot and DeleteSnapshot: a snapshot is an NVMeSnapshot in the driver namespace, which
// the agent turns into an SPDK lvol snapshot. Ids have the volume id shape
// "<namespace>/<snapshot name>/<uid>"; the in-flight key is prefixed so a snapshot and a volume of
// the same name never serialise against each other.
import type { MessageInitShape } from "@bufbuild/protobuf";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import type { HandlerContext } from "@connectrpc/connect";
import { API_VERSION, GROUP_SNAPSHOT_LABEL, type NVMeSnapshot } from "../../api/index.ts";
import type {
  CreateSnapshotRequest,
  DeleteSnapshotRequest,
  SnapshotSchema,
} from "../../gen/csi/v1/csi_pb.ts";
import { StorageError } from "../../lib/errors.ts";
import { aborted, alreadyExists, failedPrecondition, invalidArgument, notFound } from "../errors.ts";
import { PROVISIONED_BY, PROVISIONED_BY_LABEL } from "./fingerprint.ts";
import type { ControllerState } from "./state.ts";
import { formatVolumeId, MAX_REQUEST_NAME_LENGTH, parseVolumeId, partitionNameFor } from "./volume-id.ts";

/** Annotations CreateSnapshot records on an NVMeSnapshot for idempotency checks. */
export const SnapshotAnnotations = {
  requestName: "storage.distort.io/snapshot-request-name",
  sourceVolumeId: "storage.distort.io/source-volume-id",
} as const;

/**
 * The CSI Snapshot of an NVMeSnapshot in namespace `ns`. The source volume id is the one recorded
 * at creation, else composed from the spec when that makes a valid id, else empty; a member of a
 * volume group snapshot carries its group id. Pure.
 */
export function snapshotInfo(s: NVMeSnapshot, ns: string): MessageInitShape<typeof SnapshotSchema> {
  const created = s.status?.creationTime ?? s.metadata.creationTimestamp;
  const group = s.metadata.labels?.[GROUP_SNAPSHOT_LABEL];
  let sourceVolumeId = s.metadata.annotations?.[SnapshotAnnotations.sourceVolumeId] ?? "";
  if (!sourceVolumeId) {
    const src = { namespace: ns, name: s.spec.sourcePartitionName, uid: s.spec.sourcePartitionUID };
    if (parseVolumeId(`${src.namespace}/${src.name}/${src.uid}`)) sourceVolumeId = formatVolumeId(src);
  }
  return {
    snapshotId: formatVolumeId({ namespace: ns, name: s.metadata.name, uid: s.metadata.uid as string }),
    sourceVolumeId,
    sizeBytes: BigInt(s.status?.sizeBytes ?? 0),
    readyToUse: s.status?.readyToUse === true,
    ...(created ? { creationTime: timestampFromDate(new Date(created)) } : {}),
    // A group member names its group (CSI: empty for a snapshot outside any group).
    ...(group ? { groupSnapshotId: `${ns}/${group}` } : {}),
  };
}

/** The message of a Ready=False that waiting cannot cure (the agent refused the snapshot). Pure. */
export function snapshotRefusal(s: NVMeSnapshot): string | undefined {
  const c = s.status?.conditions?.find((x) => x.type === "Ready");
  return c?.status === "False" && (c.reason === "SourceNotFound" || c.reason === "UnsupportedBackend")
    ? c.message
    : undefined;
}

/**
 * CreateSnapshot: creates (or finds again) the NVMeSnapshot for the request name and waits within
 * the call's budget until the agent reports it ready to use. Idempotent per (name, source);
 * ALREADY_EXISTS when the name was used for another source, NOT_FOUND for a gone source,
 * FAILED_PRECONDITION for a kernel-backend source or one the agent refused.
 */
export async function createSnapshot(c: ControllerState, req: CreateSnapshotRequest, ctx: HandlerContext) {
  if (!req.name) throw invalidArgument("name is required");
  const nameBytes = Buffer.byteLength(req.name);
  if (nameBytes > MAX_REQUEST_NAME_LENGTH)
    throw invalidArgument(`name is ${nameBytes} bytes long; at most ${MAX_REQUEST_NAME_LENGTH} are allowed`);
  if (!req.sourceVolumeId) throw invalidArgument("source_volume_id is required");
  if (Object.keys(req.parameters).length > 0)
    throw invalidArgument(
      `CreateSnapshot takes no parameters (got ${Object.keys(req.parameters).join(", ")})`,
    );
  c.requireSynced();
  const name = partitionNameFor(req.name);
  const key = c.key(name);
  return c.inFlight.run(`snapshot:${key}`, `CreateSnapshot ${req.name}`, async () => {
    let s = await c.snapClient.get(name, c.ns);
    if (s) {
      const ann = s.metadata.annotations ?? {};
      if (ann[SnapshotAnnotations.requestName] !== req.name)
        throw alreadyExists(`NVMeSnapshot ${key} belongs to another snapshot request`);
      if (ann[SnapshotAnnotations.sourceVolumeId] !== req.sourceVolumeId)
        throw alreadyExists(
          `snapshot ${req.name} already exists for source volume ${ann[SnapshotAnnotations.sourceVolumeId]}, not ${req.sourceVolumeId}`,
        );
      if (s.metadata.deletionTimestamp)
        throw aborted(`snapshot ${req.name} is being deleted; retry once it is gone`);
    } else {
      const ref = c.ref(req.sourceVolumeId);
      const p = ref && (await c.partitionOf(ref));
      if (!ref || !p || p.metadata.deletionTimestamp)
        throw notFound(`source volume ${req.sourceVolumeId} does not exist`);
      if ((p.spec.backend ?? "spdk") !== "spdk")
        throw failedPrecondition(
          `source volume ${req.sourceVolumeId} uses the kernel backend: disk partitions cannot be snapshotted`,
        );
      if ((p.spec.replicas ?? 1) > 1)
        throw failedPrecondition(
          `source volume ${req.sourceVolumeId} is replicated (${p.spec.replicas} copies): snapshots are taken of one lvol, and a snapshot of every copy at one point in time is not supported yet`,
        );
      try {
        s = await c.snapClient.create({
          apiVersion: API_VERSION,
          kind: "NVMeSnapshot",
          metadata: {
            name,
            namespace: c.ns,
            labels: { [PROVISIONED_BY_LABEL]: PROVISIONED_BY },
            annotations: {
              [SnapshotAnnotations.requestName]: req.name,
              [SnapshotAnnotations.sourceVolumeId]: req.sourceVolumeId,
            },
          },
          spec: { sourcePartitionName: ref.name, sourcePartitionUID: ref.uid },
        });
      } catch (err) {
        if (err instanceof StorageError && err.kind === "already-exists")
          throw aborted(`snapshot ${req.name} was created concurrently; retry`);
        throw err;
      }
      c.log.info("snapshot requested", { snapshot: key, source: req.sourceVolumeId });
    }
    const uid = s.metadata.uid as string;
    let last: NVMeSnapshot | undefined = s;
    const ready = await c.budget(
      ctx,
      (signal) =>
        c.snapshotWaiter.waitFor(
          key,
          (o) => {
            if (!o || o.metadata.uid !== uid) return undefined;
            last = o;
            const refused = snapshotRefusal(o);
            if (refused) throw failedPrecondition(refused);
            return o.status?.readyToUse ? o : undefined;
          },
          signal,
        ),
      () => {
        const cond = last?.status?.conditions?.find((x) => x.type === "Ready");
        return `snapshot ${req.name} (NVMeSnapshot ${key}) is not ready yet${cond ? `: ${cond.reason}: ${cond.message}` : ""}`;
      },
    );
    return { snapshot: snapshotInfo(ready, c.ns) };
  });
}

/**
 * DeleteSnapshot: deletes exactly the incarnation the id names and waits until the agent has
 * removed it, or has deferred removal until the clones still reading from it are gone (OK either
 * way). OK for ids that are not ours or already gone.
 */
export async function deleteSnapshot(c: ControllerState, req: DeleteSnapshotRequest, ctx: HandlerContext) {
  if (!req.snapshotId) throw invalidArgument("snapshot_id is required");
  const ref = c.ref(req.snapshotId);
  if (!ref) return {}; // never one of ours
  c.requireSynced();
  const key = c.key(ref.name);
  return c.inFlight.run(`snapshot:${key}`, "DeleteSnapshot", async () => {
    const s = await c.snapshotOf(ref);
    if (!s) return {};
    if (!s.metadata.deletionTimestamp) {
      try {
        await c.snapClient.delete(ref.name, c.ns, { uid: ref.uid });
      } catch (err) {
        if (err instanceof StorageError && err.kind === "conflict") return {};
        throw err;
      }
    }
    // Clones still reading from the snapshot keep its lvol alive; the agent deletes it once
    // they are gone. For CSI the snapshot is deleted as soon as the agent says so.
    const blocked = Symbol("blocked");
    try {
      await c.budget(
        ctx,
        (signal) =>
          c.waitGone(c.snapshotWaiter, c.snapClient, ref.name, ref.uid, signal, (o) => {
            if (o.status?.conditions?.some((x) => x.type === "DeletionBlocked" && x.status === "True"))
              throw blocked;
          }),
        () => `deletion of snapshot ${key} is not finished: the agent holds its finalizer`,
      );
    } catch (err) {
      if (err !== blocked) throw err;
      c.log.info("snapshot deletion deferred until its clones are gone", { snapshot: key });
      return {};
    }
    c.log.info("snapshot deleted", { snapshot: key, uid: ref.uid });
    return {};
  });
}
