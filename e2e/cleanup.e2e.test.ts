// Deleting a volume leaves nothing: after its Pod and PVC go, no PV, VolumeAttachment,
// NVMeVolumeAttachment or NVMePartition remains, the targets hold no lvol, subsystem or host entry
// for it, the consumer no loop device or mount, and the device ledger has its bytes back.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { deletePod, type E2eLab, e2eLab, workloadPod } from "./support.ts";
import { blockWorkloadPod, createClaim, deleteClaim, teardownNamespace, waitHeld } from "./user-steps.ts";
import {
  captureVolume,
  ledgerView,
  residueOf,
  type VolumeTrace,
  waitLedgerRestored,
  waitNoResidue,
} from "./volume-trace.ts";

let lab: E2eLab;

beforeAll(async () => {
  lab = await e2eLab();
}, 120_000);

afterAll(() => lab.stop());

/** The lab's i-th consumer node. */
function consumer(i: number): string {
  const c = lab.consumers[i];
  if (!c) throw new Error(`the lab has no consumer node #${i}`);
  return c.name;
}

interface Use {
  claim: string;
  pod: string;
  node: string;
  block?: boolean;
}

/** Creates each claim and a Pod that writes to it and holds; returns each volume's trace. */
async function useVolumes(ns: string, uses: Use[]): Promise<VolumeTrace[]> {
  await Promise.all(
    uses.map(async (u, i) => {
      await createClaim(lab, ns, u.claim, { size: "256Mi", ...(u.block ? { volumeMode: "Block" } : {}) });
      const args = ["write", "--bytes=4Mi", `--seed=cleanup-${i}`, "--then-hold"];
      const pod = u.block
        ? blockWorkloadPod(u.pod, u.node, u.claim, args)
        : workloadPod(u.pod, u.node, u.claim, args);
      await lab.core.createNamespacedPod({ namespace: ns, body: pod });
    }),
  );
  const reports = await Promise.all(uses.map((u) => waitHeld(lab, ns, u.pod, 300_000)));
  for (const r of reports) expect(r.ok).toBe(true);
  return Promise.all(uses.map((u) => captureVolume(lab, ns, u.claim, u.node)));
}

/** Everything a trace names was really there, so its absence afterwards means something. */
function expectComplete(t: VolumeTrace): void {
  expect(t.volumeAttachment).not.toBe("");
  expect(t.nvmeAttachment).not.toBe("");
  expect(t.loopDevice).toStartWith("/dev/loop");
  expect(t.mounts.length).toBeGreaterThan(0);
  expect(t.reservedBytes).toBeGreaterThanOrEqual(256 * 1024 * 1024);
}

test("deleting a Pod and its PVC leaves nothing of the volume anywhere", async () => {
  const ns = await lab.newNamespace("cleanup");
  try {
    const before = await ledgerView(lab);
    const [t] = await useVolumes(ns, [{ claim: "data", pod: "writer", node: consumer(0) }]);
    if (!t) throw new Error("no trace");
    expectComplete(t);
    // While in use, the volume is visible in every place the final check looks.
    const inUse = await residueOf(lab, [t]);
    const places = [
      "still exists",
      ": PV ",
      ": VolumeAttachment ",
      ": NVMeVolumeAttachment ",
      ": NVMePartition ",
      ": device ",
      ": lvol ",
      ": bdev ",
      ": subsystem ",
      ": loop device ",
      "still mounted",
    ];
    expect(places.filter((k) => !inUse.some((l) => l.includes(k)))).toEqual([]);
    const during = await ledgerView(lab);
    expect(during.get(t.device.name)?.entries.get(t.partition.uid)).toBe(t.reservedBytes);

    await deletePod(lab, ns, "writer", 180_000);
    await deleteClaim(lab, ns, "data");
    await waitNoResidue(lab, [t]);
    await waitLedgerRestored(lab, before);
  } finally {
    await teardownNamespace(lab, ns);
  }
}, 600_000);

test("five volumes on two nodes deleted at once leave nothing behind", async () => {
  const ns = await lab.newNamespace("cleanup");
  try {
    const before = await ledgerView(lab);
    const uses: Use[] = [0, 1, 2, 3, 4].map((i) => ({
      claim: `data-${i}`,
      pod: `writer-${i}`,
      node: consumer(i % 2),
      // One raw block volume: its staging and publication take other paths on the node.
      block: i === 4,
    }));
    const traces = await useVolumes(ns, uses);
    for (const t of traces) expectComplete(t);
    expect(new Set(traces.map((t) => t.loopDevice)).size).toBe(5);
    expect(new Set(traces.map((t) => t.nqn)).size).toBe(5);

    await Promise.all(uses.map((u) => deletePod(lab, ns, u.pod, 240_000)));
    await Promise.all(uses.map((u) => deleteClaim(lab, ns, u.claim, 240_000)));
    await waitNoResidue(lab, traces, 300_000);
    await waitLedgerRestored(lab, before);
  } finally {
    await teardownNamespace(lab, ns);
  }
}, 900_000);
