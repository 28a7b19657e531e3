// Accepting data loss against a real kube-apiserver, with the copies' agents played by the test:
// a two-copy volume whose serving node dies after the other copy was dropped (Faulted) stays
// unserved and says why; a bad accept-data-loss value is refused with an Event and changes
// nothing; "newest" fences the stale copy to its own node, raises the generation with it alone
// current, records DataLossAccepted, removes the annotation, and only then is it served. Once
// served again (accepted, or the lost node back), Serving False clears to True.
import { afterAll, beforeAll, expect, test } from "bun:test";
import {
  ACCEPT_DATA_LOSS_ANNOTATION,
  API_VERSION,
  kinds,
  type NVMePartition,
  type NVMeVolumeAttachment,
} from "../../api/index.ts";
import { eventually, type TestCluster, testCluster } from "../../lab/cluster/test-support.ts";
import { ResourceClient } from "../../lib/kube/resource.ts";
import { updateStatus } from "../../lib/kube/status.ts";
import { attachmentNameFor, nexusHostNqnFor } from "../../lib/volume-identity.ts";
import { GiB } from "../testdata/fixtures.ts";
import { type Harness, harness } from "../testdata/harness.ts";
import { ACCEPT_DATA_LOSS_INVALID } from "./accept-data-loss.ts";

let tc: TestCluster;
const harnesses: Harness[] = [];
beforeAll(async () => {
  tc = await testCluster();
}, 300_000);
afterAll(async () => {
  await Promise.all(harnesses.map((h) => h.stop()));
  await tc?.stop();
});

/** What each copy's agent does with its admission record: enforce the lifetime it names. */
async function enforceAdmissions(
  h: Harness,
  attachments: ResourceClient<NVMeVolumeAttachment>,
): Promise<void> {
  for (const a of (await attachments.list({ namespace: h.ns })).items) {
    if (a.status?.observedAttachmentId === a.spec.attachmentId) continue;
    await updateStatus(attachments, a.metadata.name, h.ns, (latest) => ({
      ...(latest.status ?? { conditions: [] }),
      observedAttachmentId: latest.spec.attachmentId,
      conditions: latest.status?.conditions ?? [],
    }));
  }
}

/**
 * Beats for storage node `node` every second, as its agent would (the volumes' bound is 5 s),
 * until the returned stop is awaited (at most 120 beats).
 */
function beating(h: Harness, node: string): () => Promise<void> {
  const beat = () =>
    updateStatus(h.nodes, node, h.ns, (latest) => ({
      ...(latest.status ?? { conditions: [] }),
      lastHeartbeatTime: new Date().toISOString(),
      conditions: latest.status?.conditions ?? [],
    }));
  let on = true;
  const loop = (async () => {
    for (let i = 0; on && i < 120; i++) {
      await beat();
      await Bun.sleep(1000);
    }
  })();
  return async () => {
    on = false;
    await loop;
  };
}

const serving = (v: NVMePartition | undefined) => v?.status?.conditions.find((c) => c.type === "Serving");

/**
 * A two-copy volume served and admitted, whose serving node dropped the other copy (Faulted at
 * generation 1, the data generation raised to 2 over its own copy) and then stopped beating.
 */
async function stuckVolume(prefix: string) {
  const h = await harness(tc, prefix);
  harnesses.push(h);
  for (const node of ["node-a", "node-b"]) {
    await h.createDevice(node, { node, serial: `S-${h.ns}-${node}`, allocatable: 20 * GiB });
    await h.createClaim(`claim-${node}`, `S-${h.ns}-${node}`);
    await h.createNode(node);
  }
  await h.start();
  const attachments = new ResourceClient(tc.conn, kinds.NVMeVolumeAttachment);
  const vol = await h.partitions.create({
    apiVersion: API_VERSION,
    kind: "NVMePartition",
    metadata: { name: "vol", namespace: h.ns, labels: h.label },
    spec: {
      sizeBytes: 3 * GiB,
      backend: "spdk",
      volumeManager: "spdk-lvol",
      targetOptions: { transport: "tcp" },
      replicas: 2,
      failoverAfterSeconds: 5,
    },
  });
  const uid = vol.metadata.uid as string;
  const copies = await eventually(
    async () => {
      const rs = (await h.partitions.list({ namespace: h.ns })).items.filter(
        (p) => p.spec.replicaOf?.uid === uid,
      );
      return rs.length === 2 && rs.every((r) => r.spec.nodeName) && rs;
    },
    20_000,
    "two placed copies",
  );
  for (const r of copies)
    await updateStatus(h.partitions, r.metadata.name, h.ns, (latest) => ({
      ...(latest.status ?? { conditions: [] }),
      state: "Exported" as const,
      conditions: latest.status?.conditions ?? [],
    }));
  const first = await eventually(
    async () => {
      const v = await h.partitions.get("vol", h.ns);
      return v?.spec.nodeName !== undefined && v.status?.dataGeneration === 1 ? v : undefined;
    },
    15_000,
    "served",
  );
  await eventually(
    async () => (await attachments.list({ namespace: h.ns })).items.length === 2,
    10_000,
    "admitted",
  );
  await enforceAdmissions(h, attachments);
  const lost = first.spec.nodeName as string;
  const lostCopy = copies.find((r) => r.spec.nodeName === lost) as NVMePartition;
  const other = copies.find((r) => r.spec.nodeName !== lost) as NVMePartition;
  const otherNode = other.spec.nodeName as string;

  // The serving node drops the other copy (it stopped answering): Faulted at generation 1, the
  // data generation raised to 2 over its own copy (what its agent writes). Writes go on to the
  // serving node's copy alone.
  await updateStatus(h.partitions, "vol", h.ns, (latest) => ({
    ...(latest.status as NonNullable<NVMePartition["status"]>),
    dataGeneration: 2,
    replicas: (latest.status?.replicas ?? []).map((e) =>
      e.name === lostCopy.metadata.name
        ? { ...e, generation: 2, state: "Online" as const }
        : { ...e, generation: 1, state: "Faulted" as const, message: "unreachable past 10 s" },
    ),
  }));
  // Then the serving node dies with the only current copy.
  await updateStatus(h.nodes, lost, h.ns, (latest) => ({
    ...(latest.status ?? { conditions: [] }),
    lastHeartbeatTime: new Date(Date.now() - 40_000).toISOString(),
    conditions: latest.status?.conditions ?? [],
  }));

  return { h, attachments, lost, lostCopy, other, otherNode };
}

test("no current copy left: nothing stale is served until accept-data-loss says which, and it acts once", async () => {
  const { h, attachments, lost, lostCopy, other, otherNode } = await stuckVolume("dataloss");
  // The other copy's node lives on (it serves at the end); the lost one stays silent.
  const stop = beating(h, otherNode);
  try {
    // Stuck, and it says why and what the operator can choose.
    const stuck = await eventually(
      async () => {
        const v = await h.partitions.get("vol", h.ns);
        return serving(v)?.reason === "NoLiveCurrentCopy" ? v : undefined;
      },
      15_000,
      "NoLiveCurrentCopy",
    );
    expect(serving(stuck)?.message).toContain(`${other.metadata.name} on ${otherNode} at generation 1`);
    expect(serving(stuck)?.message).toContain(`${ACCEPT_DATA_LOSS_ANNOTATION}=newest`);
    expect((await h.events("vol")).some((e) => e.startsWith("Warning FailoverBlocked"))).toBe(true);
    await Bun.sleep(1500);
    const still = await h.partitions.get("vol", h.ns);
    expect(still?.spec.nodeName).toBe(lost);
    expect(still?.status?.dataGeneration).toBe(2);

    // A value naming no copy: refused, said so, nothing moves, the annotation stays for a fix.
    await h.partitions.mergePatch("vol", h.ns, {
      metadata: { annotations: { [ACCEPT_DATA_LOSS_ANNOTATION]: "vol-r7" } },
    });
    const refused = await eventually(
      async () => {
        const v = await h.partitions.get("vol", h.ns);
        return serving(v)?.reason === ACCEPT_DATA_LOSS_INVALID ? v : undefined;
      },
      15_000,
      "refused",
    );
    expect(serving(refused)?.message).toContain("names no copy of this volume");
    expect((await h.events("vol")).some((e) => e.startsWith("Warning AcceptDataLossRefused"))).toBe(true);
    expect(refused.metadata.annotations?.[ACCEPT_DATA_LOSS_ANNOTATION]).toBe("vol-r7");
    expect(refused.status?.dataGeneration).toBe(2);
    const otherAdmission = attachmentNameFor(other.metadata.name, other.metadata.uid as string);
    expect((await attachments.get(otherAdmission, h.ns))?.spec.hostNQN).toBe(nexusHostNqnFor(lost));

    // "newest": the stale copy is fenced to its own node first; nothing raised before enforced.
    await h.partitions.mergePatch("vol", h.ns, {
      metadata: { annotations: { [ACCEPT_DATA_LOSS_ANNOTATION]: "newest" } },
    });
    await eventually(
      async () => (await attachments.get(otherAdmission, h.ns))?.spec.hostNQN === nexusHostNqnFor(otherNode),
      15_000,
      "stale copy fenced to its node",
    );
    await Bun.sleep(1500);
    expect((await h.partitions.get("vol", h.ns))?.status?.dataGeneration).toBe(2);
    await enforceAdmissions(h, attachments);
    const served = await eventually(
      async () => {
        const v = await h.partitions.get("vol", h.ns);
        return v?.spec.nodeName === otherNode ? v : undefined;
      },
      15_000,
      "served from the stale copy's node",
    );
    expect(served.status?.dataGeneration).toBe(3);
    expect(served.status?.replicas?.find((e) => e.name === other.metadata.name)).toMatchObject({
      state: "Online",
      generation: 3,
    });
    expect(served.status?.replicas?.find((e) => e.name === lostCopy.metadata.name)).toMatchObject({
      state: "Stale",
      generation: 2,
    });
    expect(served.metadata.annotations?.[ACCEPT_DATA_LOSS_ANNOTATION]).toBeUndefined();
    const events = await h.events("vol");
    const accepted = events.filter((e) => e.startsWith("Warning DataLossAccepted"));
    expect(accepted).toHaveLength(1);
    expect(accepted[0]).toContain(`copy ${other.metadata.name} on ${otherNode} (generation 1)`);
    expect(accepted[0]).toContain("writes of generation 2 are lost");
    expect(events.some((e) => e.startsWith("Warning FailedOver"))).toBe(true);
    // Served again: the refusal's Serving False is gone, and the condition names the new node.
    const cleared = await eventually(
      async () => {
        const c = serving(await h.partitions.get("vol", h.ns));
        return c?.status === "True" ? c : undefined;
      },
      10_000,
      "Serving True",
    );
    expect(cleared.message).toContain(`served from ${otherNode}`);
  } finally {
    await stop();
  }
}, 120_000);

test("the lost serving node comes back: the stuck volume's Serving False clears to Served", async () => {
  const { h, lost } = await stuckVolume("nodeback");
  await eventually(
    async () => serving(await h.partitions.get("vol", h.ns))?.reason === "NoLiveCurrentCopy",
    15_000,
    "NoLiveCurrentCopy",
  );
  // It beats again: nothing fails over, the node serves its own current copy.
  const stop = beating(h, lost);
  try {
    const back = await eventually(
      async () => {
        const v = await h.partitions.get("vol", h.ns);
        return serving(v)?.status === "True" ? v : undefined;
      },
      15_000,
      "Serving True",
    );
    expect(serving(back)).toMatchObject({
      status: "True",
      reason: "Served",
      message: `served from node ${lost}`,
    });
    expect(back.spec.nodeName).toBe(lost);
    expect(back.status?.dataGeneration).toBe(2);
    // And it stays while the node beats: no failover step runs, nothing writes False again.
    await Bun.sleep(7000);
    const later = await h.partitions.get("vol", h.ns);
    expect(serving(later)).toMatchObject({ status: "True", reason: "Served" });
    expect(later?.spec.nodeName).toBe(lost);
  } finally {
    await stop();
  }
}, 120_000);
