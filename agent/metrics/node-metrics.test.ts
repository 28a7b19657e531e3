// The agent's family list and the "attachment not ready" ages: only this node's partitions' current
// attachments count, a ready one drops out, and the age runs from the condition's last transition.
import { expect, test } from "bun:test";
import type { NVMePartition, NVMeVolumeAttachment } from "../../api/index.ts";
import { Registry } from "../../lib/metrics.ts";
import { registerAgentMetrics, unreadyAttachments } from "./node-metrics.ts";

const partition = (name: string, uid: string) =>
  ({ metadata: { namespace: "ns", name, uid } }) as unknown as NVMePartition;

function attachment(
  partitionName: string,
  partitionUID: string,
  status?: { ready: "True" | "False"; at: string; observed?: string },
): NVMeVolumeAttachment {
  return {
    metadata: { namespace: "ns", name: `a-${partitionName}`, creationTimestamp: "2026-12-01T00:00:00Z" },
    spec: {
      partitionName,
      partitionUID,
      nodeId: "n",
      hostNQN: "nqn.2014-08.org.nvmexpress:uuid:x",
      attachmentId: "id1",
    },
    ...(status && {
      status: {
        observedAttachmentId: status.observed ?? "id1",
        conditions: [
          {
            type: "AccessReady",
            status: status.ready,
            lastTransitionTime: status.at,
            reason: "R",
            message: "",
          },
        ],
      },
    }),
  } as unknown as NVMeVolumeAttachment;
}

test("unready attachments of this node's partitions, aged from the last transition", () => {
  const now = Date.parse("2026-12-01T00:10:00Z");
  const rows = unreadyAttachments(
    [
      attachment("new", "u1"),
      attachment("waiting", "u2", { ready: "False", at: "2026-12-01T00:05:00Z" }),
      attachment("ready", "u3", { ready: "True", at: "2026-12-01T00:01:00Z" }),
      attachment("stale-id", "u4", { ready: "True", at: "2026-12-01T00:09:00Z", observed: "id0" }),
      attachment("other-node", "u9"),
      attachment("waiting", "old-uid"),
    ],
    [
      partition("new", "u1"),
      partition("waiting", "u2"),
      partition("ready", "u3"),
      partition("stale-id", "u4"),
    ],
    now,
  );
  expect(rows.sort((a, b) => a[0].partition.localeCompare(b[0].partition))).toEqual([
    [{ namespace: "ns", partition: "new" }, 600],
    [{ namespace: "ns", partition: "stale-id" }, 60],
    [{ namespace: "ns", partition: "waiting" }, 300],
  ]);
});

test("the agent registers the supervisor's, the controllers' and its own families", () => {
  const registry = new Registry();
  registerAgentMetrics(registry);
  registerAgentMetrics(registry); // reuse: a second registration is the same families
  const names = registry.families().map((f) => f.name);
  for (const n of [
    "distort_nvmf_tgt_up",
    "distort_nvmf_tgt_starts_total",
    "distort_reconcile_errors_total",
    "distort_volume_read_ops_total",
    "distort_lvstore_free_bytes",
    "distort_attachment_unready_seconds",
  ]) {
    expect(names).toContain(n);
  }
});
