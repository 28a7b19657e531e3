// `kubectl distort fence NODE` / `unfence NODE`: DISTORT's fencing mechanism is the
// storage.distort.io/fenced=true annotation on the NVMeVolumeAttachments a node holds (see
// csi/controller/fencing.ts). With it, the next ControllerPublish from another node takes the
// volume over (the target's ACL moves to the new host and the old host is revoked); without it,
// a second node is refused. Fencing says "this node can no longer reach the target": an operator
// asserts that after powering the node off or cutting it from the fabric.
import { kinds } from "../api/kinds.ts";
import type { NVMeVolumeAttachment } from "../api/nvme-volume-attachment.ts";
import { FENCED_ANNOTATION } from "../csi/controller/fencing.ts";
import { sameNode } from "../lib/csi-node-id.ts";
import { StorageError } from "../lib/errors.ts";
import type { KubeConnection } from "../lib/kube/connection.ts";
import { type JsonPatchOp, ResourceClient } from "../lib/kube/resource.ts";
import { UsageError } from "./exit-codes.ts";
import { describeFailure } from "./status.ts";

/** One attachment the command looked at, and what happened to it. */
export interface FenceResult {
  namespace: string;
  name: string;
  partition: string;
  nodeId: string;
  /** changed: annotation written/removed; unchanged: already so; moved: taken over meanwhile. */
  outcome: "changed" | "unchanged" | "moved" | "would-change";
}

const ANNOTATION_PATH = `/metadata/annotations/${FENCED_ANNOTATION.replace(/~/g, "~0").replace(/\//g, "~1")}`;

/** The JSON patch that fences (or unfences) `a`; its tests make it apply only while `a` is held by the same node ID. Pure. */
export function fencePatch(a: NVMeVolumeAttachment, fence: boolean): JsonPatchOp[] | undefined {
  const has = a.metadata.annotations?.[FENCED_ANNOTATION] === "true";
  if (fence === has) return undefined;
  const ops: JsonPatchOp[] = [
    { op: "test", path: "/metadata/uid", value: a.metadata.uid },
    { op: "test", path: "/spec/nodeId", value: a.spec.nodeId },
  ];
  if (!fence) return [...ops, { op: "remove", path: ANNOTATION_PATH }];
  if (!a.metadata.annotations)
    return [...ops, { op: "add", path: "/metadata/annotations", value: { [FENCED_ANNOTATION]: "true" } }];
  return [...ops, { op: "add", path: ANNOTATION_PATH, value: "true" }];
}

/**
 * Fences (fence=true) or unfences every NVMeVolumeAttachment held by `node` (compared by node name,
 * so both node ID formats match) in `namespace` (null: all). Idempotent: an attachment already so
 * is "unchanged"; one taken over between the list and the patch is "moved" and left alone.
 * Throws UsageError when the API server cannot be read or written.
 */
export async function setFenced(
  conn: KubeConnection,
  node: string,
  namespace: string | null,
  fence: boolean,
  dryRun = false,
): Promise<FenceResult[]> {
  const client = new ResourceClient(conn, kinds.NVMeVolumeAttachment);
  let items: NVMeVolumeAttachment[];
  try {
    items = (await client.list(namespace === null ? {} : { namespace })).items;
  } catch (err) {
    throw new UsageError(describeFailure(err, conn.server, "list NVMeVolumeAttachments"));
  }
  const held = items.filter((a) => sameNode(a.spec.nodeId, node) && !a.metadata.deletionTimestamp);
  const out: FenceResult[] = [];
  for (const a of held.sort(
    (x, y) =>
      (x.metadata.namespace ?? "").localeCompare(y.metadata.namespace ?? "") ||
      x.metadata.name.localeCompare(y.metadata.name),
  )) {
    const base = {
      namespace: a.metadata.namespace ?? "",
      name: a.metadata.name,
      partition: a.spec.partitionName,
      nodeId: a.spec.nodeId,
    };
    const ops = fencePatch(a, fence);
    if (!ops) {
      out.push({ ...base, outcome: "unchanged" });
      continue;
    }
    if (dryRun) {
      out.push({ ...base, outcome: "would-change" });
      continue;
    }
    try {
      await client.jsonPatch(a.metadata.name, a.metadata.namespace, ops);
      out.push({ ...base, outcome: "changed" });
    } catch (err) {
      // A failed test: the attachment was taken over or replaced meanwhile; its new holder is not ours to touch.
      if (err instanceof StorageError && (err.kind === "invalid" || err.kind === "not-found")) {
        out.push({ ...base, outcome: "moved" });
        continue;
      }
      throw new UsageError(
        describeFailure(err, conn.server, `patch NVMeVolumeAttachment ${a.metadata.name}`),
      );
    }
  }
  return out;
}

/** Text for people: one line per attachment and what to do next. Pure. */
export function renderFence(node: string, fence: boolean, results: readonly FenceResult[]): string {
  if (results.length === 0)
    return `node ${node} holds no NVMeVolumeAttachment: nothing to ${fence ? "fence" : "unfence"}\n`;
  const verb = {
    changed: fence ? "fenced" : "unfenced",
    unchanged: fence ? "already fenced" : "not fenced",
    moved: "taken over meanwhile, left alone",
    "would-change": fence ? "would fence" : "would unfence",
  };
  const lines = results.map((r) => `${r.namespace}/${r.name} (partition ${r.partition}): ${verb[r.outcome]}`);
  if (fence)
    lines.push(
      "",
      `Publishing these volumes on another node now takes them over from ${node}. Fence only a node that can no longer reach the targets.`,
    );
  return `${lines.join("\n")}\n`;
}
