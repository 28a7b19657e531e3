// The CSI GroupController: a volume group snapshot is the set of NVMeSnapshots labelled with its
// group name, each carrying the whole group record (request name, member names, source volume
// ids), so any one member names the group. The agent takes every member in one burst (see
// agent/snapshots/group.ts). Group ids are "<namespace>/<group name>".
import { createHash } from "node:crypto";
import type { MessageInitShape } from "@bufbuild/protobuf";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import type { HandlerContext } from "@connectrpc/connect";
import {
  API_VERSION,
  GROUP_SNAPSHOT_LABEL,
  GROUP_SPANS_NODES_REASON,
  GroupSnapshotAnnotations,
  groupMembersOf,
  type NVMeSnapshot,
} from "../../api/index.ts";
import type {
  CreateVolumeGroupSnapshotRequest,
  DeleteVolumeGroupSnapshotRequest,
  GetVolumeGroupSnapshotRequest,
  VolumeGroupSnapshotSchema,
} from "../../gen/csi/v1/csi_pb.ts";
import { StorageError } from "../../lib/errors.ts";
import { aborted, alreadyExists, failedPrecondition, invalidArgument, notFound } from "../errors.ts";
import { PROVISIONED_BY, PROVISIONED_BY_LABEL } from "./fingerprint.ts";
import { SnapshotAnnotations, snapshotInfo, snapshotRefusal } from "./snapshots.ts";
import type { ControllerState } from "./state.ts";
import { MAX_REQUEST_NAME_LENGTH } from "./volume-id.ts";

/** Label naming the group on every member NVMeSnapshot (the agent selects members by it). */
export const GROUP_LABEL = GROUP_SNAPSHOT_LABEL;
export const GroupAnnotations = GroupSnapshotAnnotations;

const DNS_LABEL = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;

function sha(s: string): string {
  return createHash("sha256").update(s).digest("hex");
}

/** The group name (a label value) for a request name: itself when a DNS label, else a hash. Pure. */
export function groupNameFor(requestName: string): string {
  if (requestName.length <= 63 && DNS_LABEL.test(requestName)) return requestName;
  return `grp-${sha(requestName).slice(0, 24)}`;
}

/** The member NVMeSnapshot name for one source volume of a group. Pure and deterministic. */
export function memberNameFor(groupName: string, sourceVolumeId: string): string {
  return `gs-${sha(`${groupName}\0${sourceVolumeId}`).slice(0, 24)}`;
}

/** "<namespace>/<group name>". Pure. */
export function formatGroupId(namespace: string, groupName: string): string {
  return `${namespace}/${groupName}`;
}

/** The group name of an id in namespace `ns`; undefined when the id is not one of ours. Pure. */
export function parseGroupId(id: string, ns: string): string | undefined {
  const parts = id.split("/");
  if (parts.length !== 2 || parts[0] !== ns) return undefined;
  const name = parts[1] as string;
  return name.length <= 63 && DNS_LABEL.test(name) ? name : undefined;
}

/**
 * The CSI VolumeGroupSnapshot of `members` (one per source, in record order): ready only when
 * every member is; created at the latest member's creation time. Pure.
 */
export function groupInfo(
  groupId: string,
  members: readonly NVMeSnapshot[],
  ns: string,
): MessageInitShape<typeof VolumeGroupSnapshotSchema> {
  const snapshots = members.map((m) => ({ ...snapshotInfo(m, ns), groupSnapshotId: groupId }));
  const times = members
    .map((m) => m.status?.creationTime ?? m.metadata.creationTimestamp)
    .filter((t): t is string => !!t)
    .map((t) => new Date(t).getTime());
  return {
    groupSnapshotId: groupId,
    snapshots,
    readyToUse: members.length > 0 && snapshots.every((s) => s.readyToUse),
    ...(times.length ? { creationTime: timestampFromDate(new Date(Math.max(...times))) } : {}),
  };
}

/** A refusal that waiting cannot cure on any member (the agent's), else undefined. Pure. */
export function groupRefusal(members: readonly NVMeSnapshot[]): string | undefined {
  for (const m of members) {
    const r = snapshotRefusal(m);
    if (r) return r;
    const c = m.status?.conditions?.find((x) => x.type === "Ready");
    if (c?.status === "False" && c.reason === GROUP_SPANS_NODES_REASON) return c.message;
  }
  return undefined;
}

async function membersOf(c: ControllerState, groupName: string): Promise<NVMeSnapshot[]> {
  const { items } = await c.snapClient.list({
    namespace: c.ns,
    labelSelector: `${GROUP_LABEL}=${groupName}`,
  });
  return items;
}

/** Members in record order; undefined while one the record names is missing. */
function ordered(all: readonly NVMeSnapshot[], names: readonly string[]): NVMeSnapshot[] | undefined {
  const out: NVMeSnapshot[] = [];
  for (const n of names) {
    const m = all.find((x) => x.metadata.name === n);
    if (!m) return undefined;
    out.push(m);
  }
  return out;
}

/**
 * CreateVolumeGroupSnapshot: creates (or finds again) one NVMeSnapshot per source volume, all
 * carrying the group record, and waits within the call's budget until the agent reports every
 * member ready. Idempotent per (name, set of sources); ALREADY_EXISTS when the name was used for
 * another set; NOT_FOUND for a gone source; FAILED_PRECONDITION for a kernel-backend source, for
 * sources on more than one storage node, or when the agent refused a member.
 */
export async function createVolumeGroupSnapshot(
  c: ControllerState,
  req: CreateVolumeGroupSnapshotRequest,
  ctx: HandlerContext,
) {
  if (!req.name) throw invalidArgument("name is required");
  const nameBytes = Buffer.byteLength(req.name);
  if (nameBytes > MAX_REQUEST_NAME_LENGTH)
    throw invalidArgument(`name is ${nameBytes} bytes long; at most ${MAX_REQUEST_NAME_LENGTH} are allowed`);
  if (req.sourceVolumeIds.length === 0) throw invalidArgument("source_volume_ids is required");
  if (req.sourceVolumeIds.some((id) => !id)) throw invalidArgument("source_volume_ids has an empty id");
  const sources = [...new Set(req.sourceVolumeIds)].sort();
  if (sources.length !== req.sourceVolumeIds.length)
    throw invalidArgument("source_volume_ids lists a volume more than once");
  if (Object.keys(req.parameters).length > 0)
    throw invalidArgument(
      `CreateVolumeGroupSnapshot takes no parameters (got ${Object.keys(req.parameters).join(", ")})`,
    );
  c.requireSynced();
  const group = groupNameFor(req.name);
  const groupId = formatGroupId(c.ns, group);
  const names = sources.map((id) => memberNameFor(group, id));
  return c.inFlight.run(`group:${c.key(group)}`, `CreateVolumeGroupSnapshot ${req.name}`, async () => {
    const existing = await membersOf(c, group);
    for (const m of existing) {
      const ann = m.metadata.annotations ?? {};
      if (ann[GroupAnnotations.requestName] !== req.name)
        throw alreadyExists(`group snapshot ${group} belongs to another group snapshot request`);
      if (ann[GroupAnnotations.sourceVolumeIds] !== JSON.stringify(sources))
        throw alreadyExists(
          `group snapshot ${req.name} already exists for source volumes ${ann[GroupAnnotations.sourceVolumeIds]}`,
        );
      if (m.metadata.deletionTimestamp)
        throw aborted(`group snapshot ${req.name} is being deleted; retry once it is gone`);
    }
    if (existing.length < names.length) {
      // Check every source before creating any member, so a refusal leaves nothing behind.
      const refs = [];
      const nodes = new Set<string>();
      for (const id of sources) {
        const ref = c.ref(id);
        const p = ref && (await c.partitionOf(ref));
        if (!ref || !p || p.metadata.deletionTimestamp) throw notFound(`source volume ${id} does not exist`);
        if ((p.spec.backend ?? "spdk") !== "spdk")
          throw failedPrecondition(
            `source volume ${id} uses the kernel backend: disk partitions cannot be snapshotted`,
          );
        nodes.add(p.spec.nodeName ?? "(unplaced)");
        refs.push(ref);
      }
      if (nodes.size > 1)
        throw failedPrecondition(
          `source volumes are on storage nodes ${[...nodes].sort().join(", ")}: a group snapshot needs all of them on one node`,
        );
      for (const [i, ref] of refs.entries()) {
        const name = names[i] as string;
        if (existing.some((m) => m.metadata.name === name)) continue;
        try {
          await c.snapClient.create({
            apiVersion: API_VERSION,
            kind: "NVMeSnapshot",
            metadata: {
              name,
              namespace: c.ns,
              labels: { [PROVISIONED_BY_LABEL]: PROVISIONED_BY, [GROUP_LABEL]: group },
              annotations: {
                [SnapshotAnnotations.requestName]: `${req.name}/${sources[i]}`,
                [SnapshotAnnotations.sourceVolumeId]: sources[i] as string,
                [GroupAnnotations.requestName]: req.name,
                [GroupAnnotations.members]: JSON.stringify(names),
                [GroupAnnotations.sourceVolumeIds]: JSON.stringify(sources),
              },
            },
            spec: { sourcePartitionName: ref.name, sourcePartitionUID: ref.uid },
          });
        } catch (err) {
          if (err instanceof StorageError && err.kind === "already-exists")
            throw aborted(`group snapshot ${req.name} was created concurrently; retry`);
          throw err;
        }
      }
      c.log.info("group snapshot requested", { group: groupId, sources });
    }
    let last: NVMeSnapshot[] = [];
    const ready = await c.budget(
      ctx,
      async (signal) => {
        // Any member changing may complete the group: wait on each in turn, re-reading all.
        for (;;) {
          const members = ordered(
            names.map((n) => c.snapshots.get(c.key(n))).filter((m): m is NVMeSnapshot => !!m),
            names,
          );
          if (members) {
            last = members;
            const refused = groupRefusal(members);
            if (refused) throw failedPrecondition(refused);
            const pending = members.find((m) => !m.status?.readyToUse);
            if (!pending) return members;
            await c.snapshotWaiter.waitFor(
              c.key(pending.metadata.name),
              (o) =>
                o && (o.status?.readyToUse || groupRefusal([o]) || o.metadata.uid !== pending.metadata.uid)
                  ? o
                  : undefined,
              signal,
            );
          } else {
            const missing = names.find((n) => !c.snapshots.get(c.key(n))) as string;
            await c.snapshotWaiter.waitFor(c.key(missing), (o) => o, signal);
          }
        }
      },
      () => {
        const pending = last.filter((m) => !m.status?.readyToUse).map((m) => m.metadata.name);
        return `group snapshot ${req.name} is not ready yet${pending.length ? `: waiting for ${pending.join(", ")}` : ""}`;
      },
    );
    return { groupSnapshot: groupInfo(groupId, ready, c.ns) };
  });
}

/** The snapshot ids of `members`, sorted, for comparing with a request's list. Pure. */
function idsOf(c: ControllerState, members: readonly NVMeSnapshot[]): string[] {
  return members.map((m) => snapshotInfo(m, c.ns).snapshotId as string).sort();
}

/**
 * DeleteVolumeGroupSnapshot: deletes every member and waits until the agent removed each (or
 * deferred it while clones read from it). OK for ids that are not ours or already gone;
 * FAILED_PRECONDITION when the request's snapshot_ids are not exactly the group's members.
 */
export async function deleteVolumeGroupSnapshot(
  c: ControllerState,
  req: DeleteVolumeGroupSnapshotRequest,
  ctx: HandlerContext,
) {
  if (!req.groupSnapshotId) throw invalidArgument("group_snapshot_id is required");
  const group = parseGroupId(req.groupSnapshotId, c.ns);
  if (!group) return {};
  c.requireSynced();
  return c.inFlight.run(`group:${c.key(group)}`, "DeleteVolumeGroupSnapshot", async () => {
    const members = await membersOf(c, group);
    if (members.length === 0) return {};
    if (req.snapshotIds.length > 0) {
      const want = [...req.snapshotIds].sort();
      const have = idsOf(c, members);
      if (JSON.stringify(want) !== JSON.stringify(have))
        throw failedPrecondition(
          `snapshot_ids ${want.join(", ")} are not the members of group snapshot ${req.groupSnapshotId} (${have.join(", ")})`,
        );
    }
    for (const m of members) {
      if (m.metadata.deletionTimestamp) continue;
      try {
        await c.snapClient.delete(m.metadata.name, c.ns, { uid: m.metadata.uid as string });
      } catch (err) {
        if (!(err instanceof StorageError && err.kind === "conflict")) throw err;
      }
    }
    await c.budget(
      ctx,
      async (signal) => {
        for (const m of members)
          await c
            .waitGone(
              c.snapshotWaiter,
              c.snapClient,
              m.metadata.name,
              m.metadata.uid as string,
              signal,
              (o) => {
                if (o.status?.conditions?.some((x) => x.type === "DeletionBlocked" && x.status === "True"))
                  throw new DeferredDeletion();
              },
            )
            .catch((err) => {
              if (!(err instanceof DeferredDeletion)) throw err;
            });
      },
      () =>
        `deletion of group snapshot ${req.groupSnapshotId} is not finished: the agent holds a member's finalizer`,
    );
    c.log.info("group snapshot deleted", { group: req.groupSnapshotId, members: members.length });
    return {};
  });
}

/** A member whose lvol clones still read from: the agent deletes it once they are gone. */
class DeferredDeletion extends Error {}

/**
 * GetVolumeGroupSnapshot: the group and its members as they are now. NOT_FOUND for an unknown or
 * gone group; FAILED_PRECONDITION when the request's snapshot_ids are not exactly its members.
 */
export async function getVolumeGroupSnapshot(c: ControllerState, req: GetVolumeGroupSnapshotRequest) {
  if (!req.groupSnapshotId) throw invalidArgument("group_snapshot_id is required");
  const group = parseGroupId(req.groupSnapshotId, c.ns);
  if (!group) throw notFound(`group snapshot ${req.groupSnapshotId} does not exist`);
  c.requireSynced();
  const all = await membersOf(c, group);
  const first = all[0];
  const members = first && ordered(all, groupMembersOf(first));
  if (!members || members.length === 0)
    throw notFound(`group snapshot ${req.groupSnapshotId} does not exist`);
  if (req.snapshotIds.length > 0) {
    const want = [...req.snapshotIds].sort();
    const have = idsOf(c, members);
    if (JSON.stringify(want) !== JSON.stringify(have))
      throw failedPrecondition(
        `snapshot_ids ${want.join(", ")} are not the members of group snapshot ${req.groupSnapshotId}`,
      );
  }
  return { groupSnapshot: groupInfo(req.groupSnapshotId, members, c.ns) };
}
