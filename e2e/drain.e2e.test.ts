// Drain of a storage node on the real cluster (three SPDK storage nodes: node-a, node-b, node-c).
// Three replicated volumes (2 copies each) are attached to Pods that write and verify round after
// round; the node serving the first volume is drained (spec.drain on its RDMAStorageNode). Each
// copy there is replaced on the node that holds none of that volume, rebuilt, and only then
// retired; the volumes it served are handed over to their other copy's node first. The drain ends
// with the node's Drained condition True, no partition or export of DISTORT left on it, every
// volume with two Online copies elsewhere, and every writer's rounds ok throughout (an I/O error
// fails its round and its Pod at once). Then each volume's last round is read back on another node.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { readdirSync, readFileSync } from "node:fs";
import { DRAINED, DrainReasons, kinds, type NVMePartition, type RDMAStorageNode } from "../api/index.ts";
import { type WorkloadReport, workloadReport } from "../lab/demo.ts";
import { roundSeed } from "../lab/workload.ts";
import { ResourceClient } from "../lib/kube/resource.ts";
import { silentLogger } from "../lib/log.ts";
import { SpdkClient } from "../lib/spdk/client.ts";
import { SpdkMethods } from "../lib/spdk/methods.ts";
import { volumeTarget } from "./storage-target.ts";
import {
  createPvc,
  type E2eLab,
  e2eLab,
  FinalError,
  removeSuiteObjects,
  until,
  workloadPod,
} from "./support.ts";
import { replicatedStorageClass, waitHeld } from "./user-steps.ts";

let lab: E2eLab;
beforeAll(async () => {
  lab = await e2eLab();
}, 120_000);
afterAll(async () => {
  await lab.stop();
});

const VOLUMES = 3;
/** Each writer's round: write this much of a fresh pattern, fsync, read it back and compare. */
const ROUND_BYTES = "32Mi";
const say = (s: string) => process.stdout.write(`${s}\n`);

/** The result lines a rounds writer printed so far (its log). */
async function rounds(ns: string, pod: string): Promise<WorkloadReport[]> {
  const log = String(await lab.core.readNamespacedPodLog({ name: pod, namespace: ns }).catch(() => ""));
  return log
    .split("\n")
    .filter((l) => l.startsWith("{"))
    .map((l) => JSON.parse(l) as WorkloadReport);
}

/** SIGTERM to the workload process whose command line carries `--seed=<seed>`: it ends after its round. */
function stopWorkload(seed: string): number {
  const want = `--seed=${seed}`;
  for (const d of readdirSync("/proc")) {
    if (!/^\d+$/.test(d)) continue;
    let argv: string[];
    try {
      argv = readFileSync(`/proc/${d}/cmdline`, "utf8").split("\0");
    } catch {
      continue;
    }
    if (argv.includes(want) && argv.includes("--rounds=0")) {
      process.kill(Number(d), "SIGTERM");
      return Number(d);
    }
  }
  throw new Error(`no workload process with ${want}`);
}

test("drain of a storage node with three replicated volumes attached and writing: every copy moves, the node ends empty, no Pod sees an I/O error", async () => {
  if (lab.storage.length < 3) throw new Error("the lab needs three SPDK storage nodes");
  const parts = new ResourceClient<NVMePartition>(lab.conn, kinds.NVMePartition);
  const storageNodes = new ResourceClient<RDMAStorageNode>(lab.conn, kinds.RDMAStorageNode);
  const sc = await replicatedStorageClass(lab, {
    prefix: "e2e-drain",
    replicas: 2,
    failoverAfterSeconds: 10,
  });
  const ns = await lab.newNamespace("drain");
  const claims = Array.from({ length: VOLUMES }, (_, i) => `data-${i}`);
  const writers = claims.map((_, i) => `writer-${i}`);
  const seeds = claims.map((c) => `${ns}-${c}`);
  const clients: SpdkClient[] = [];
  let drained = "";
  try {
    for (const c of claims) await createPvc(lab, ns, c, { storageClass: sc, size: "1Gi" });
    const volumes: NVMePartition[] = [];
    for (const c of claims) volumes.push((await volumeTarget(lab, ns, c)).partition);
    const copiesOf = async (v: NVMePartition) =>
      (await parts.list({ namespace: lab.namespace })).items.filter(
        (p) => p.spec.replicaOf?.uid === v.metadata.uid && !p.metadata.deletionTimestamp,
      );
    for (const v of volumes)
      await until(`two copies of ${v.metadata.name} exported`, async () => {
        const l = await copiesOf(v);
        return l.length === 2 && l.every((p) => p.status?.state === "Exported") ? l : undefined;
      });
    // The drained node serves the first volume: its drain hands that volume over.
    drained = volumes[0]?.spec.nodeName as string;
    const before = new Map<string, string[]>();
    for (const v of volumes)
      before.set(v.metadata.name, (await copiesOf(v)).map((p) => p.spec.nodeName as string).sort());
    const onDrained = [...before.values()].filter((nodes) => nodes.includes(drained)).length;
    say(
      `drain: ${drained} holds copies of ${onDrained} of ${VOLUMES} volumes: ${JSON.stringify([...before])}`,
    );
    // Nothing else of DISTORT may be there: a single-copy volume would block the drain. Earlier
    // suites delete their claims as they end and the deletions finish in the background (detach,
    // then DeleteVolume), so a volume still going away is waited for; one that stays is named.
    const strangersOn = async () =>
      (await parts.list({ namespace: lab.namespace })).items.filter(
        (p) =>
          p.spec.nodeName === drained &&
          !p.spec.replicaOf &&
          !volumes.some((v) => v.metadata.uid === p.metadata.uid),
      );
    await until(
      `no other volume on ${drained}`,
      async () => (await strangersOn()).length === 0,
      180_000,
    ).catch(async (err) => {
      // Only when one stays: name it with its PV and claim (not on every poll).
      const named: string[] = [];
      for (const p of await strangersOn()) {
        const pv = await lab.core.readPersistentVolume({ name: p.metadata.name }).catch(() => undefined);
        const claim = pv?.spec?.claimRef;
        named.push(
          `${p.metadata.name} (${p.metadata.deletionTimestamp ? "deleting" : (p.status?.state ?? "no state")}; PV ${pv ? (pv.status?.phase ?? "?") : "gone"}${claim ? `, claim ${claim.namespace}/${claim.name}` : ""})`,
        );
      }
      if (named.length === 0) throw err;
      throw new Error(`${drained} holds other volumes after 180 s: ${named.join(", ")}`);
    });

    // Writers on the consumer nodes, one per volume, each writing and verifying round after round.
    const consumers = lab.consumers.map((c) => c.name);
    for (const [i, w] of writers.entries())
      await lab.core.createNamespacedPod({
        namespace: ns,
        body: workloadPod(w, consumers[i % consumers.length] as string, claims[i] as string, [
          "write-verify",
          `--bytes=${ROUND_BYTES}`,
          `--seed=${seeds[i]}`,
          "--rounds=0",
        ]),
      });
    const writing = async () => {
      const counts: number[] = [];
      for (const w of writers) {
        const p = await lab.core.readNamespacedPod({ name: w, namespace: ns });
        const lines = await rounds(ns, w);
        const bad = lines.find((l) => !l.ok);
        if (bad || p.status?.phase === "Failed" || p.status?.phase === "Succeeded")
          throw new FinalError(
            `${w} stopped writing (${p.status?.phase}): ${JSON.stringify(bad ?? workloadReport(p) ?? p.status?.containerStatuses)}`,
          );
        counts.push(lines.length);
      }
      return counts;
    };
    const started = await until(
      "every writer through its first round",
      async () => {
        const c = await writing();
        return c.every((n) => n >= 1) ? c : undefined;
      },
      300_000,
    );

    // The drain.
    const t0 = Date.now();
    await storageNodes.mergePatch(drained, lab.namespace, { spec: { drain: true } });
    let lastMessage = "";
    const done = await until(
      `${drained} Drained`,
      async () => {
        await writing();
        const n = await storageNodes.get(drained, lab.namespace);
        const c = n?.status?.conditions?.find((x) => x.type === DRAINED);
        if (c?.message && c.message !== lastMessage) {
          lastMessage = c.message;
          say(`  [${((Date.now() - t0) / 1000).toFixed(1)} s] ${c.reason}: ${c.message}`);
        }
        return c?.status === "True" ? c : undefined;
      },
      900_000,
    );
    const drainMs = Date.now() - t0;
    expect(done.reason).toBe(DrainReasons.Drained);
    const during = await writing();

    // Nothing of DISTORT is left on the node: no partition, no export on its target.
    const left = (await parts.list({ namespace: lab.namespace })).items.filter(
      (p) => p.spec.nodeName === drained,
    );
    expect(left.map((p) => p.metadata.name)).toEqual([]);
    const s = lab.storage.find((x) => x.name === drained);
    if (!s) throw new Error(`${drained} is no SPDK node`);
    const client = new SpdkClient({ socketPath: s.spdkSocket, logger: silentLogger, callTimeoutMs: 10_000 });
    clients.push(client);
    const target = new SpdkMethods(client);
    // No volume's subsystem and no copy's (every DISTORT NQN carries its prefix) on the target.
    const exported = (await target.nvmfGetSubsystems())
      .map((x) => x.nqn)
      .filter((q) => q.includes("distort"));
    expect(exported).toEqual([]);

    // Every volume: two copies, both Online at the current generation, none on the drained node,
    // served from elsewhere.
    for (const v of volumes) {
      const now = (await parts.get(v.metadata.name, v.metadata.namespace)) as NVMePartition;
      expect(now.spec.nodeName).not.toBe(drained);
      const entries = now.status?.replicas ?? [];
      const g = now.status?.dataGeneration ?? -1;
      expect(entries.map((e) => [e.state, e.generation])).toEqual([
        ["Online", g],
        ["Online", g],
      ]);
      expect(entries.some((e) => e.nodeName === drained)).toBe(false);
      const nodes = (await copiesOf(v)).map((p) => p.spec.nodeName as string).sort();
      expect(nodes).toHaveLength(2);
      expect(nodes).not.toContain(drained);
      say(
        `  ${v.metadata.name}: ${JSON.stringify(before.get(v.metadata.name))} -> ${JSON.stringify(nodes)}, served by ${now.spec.nodeName}`,
      );
    }
    // The writers wrote through the drain, and go on writing after it.
    await until(
      "every writer one round past the drain",
      async () => {
        const c = await writing();
        return c.every((n, i) => n > (during[i] ?? 0)) ? c : undefined;
      },
      300_000,
    );
    say(
      `drain of ${drained}: ${(drainMs / 1000).toFixed(1)} s; rounds before/after: ${JSON.stringify(started)} -> ${JSON.stringify(during)}`,
    );

    // Each writer ends after its round under way; its last round is read back on another node.
    const last: WorkloadReport[] = [];
    for (const [i, w] of writers.entries()) {
      stopWorkload(seeds[i] as string);
      const end = await until(
        `${w} to end`,
        async () => {
          const p = await lab.core.readNamespacedPod({ name: w, namespace: ns });
          if (p.status?.phase === "Failed")
            throw new FinalError(`${w} failed: ${JSON.stringify(workloadReport(p))}`);
          return p.status?.phase === "Succeeded" ? p : undefined;
        },
        180_000,
      );
      const lines = await rounds(ns, w);
      expect(lines.every((l) => l.ok)).toBe(true);
      const report = workloadReport(end) as WorkloadReport & { round?: number };
      expect(report).toMatchObject({ ok: true });
      expect(report.round).toBe(lines.length - 1);
      last.push(report);
    }
    for (const w of writers) await lab.core.deleteNamespacedPod({ name: w, namespace: ns });
    for (const [i, c] of claims.entries()) {
      const r = last[i] as WorkloadReport & { round: number };
      const reader = `reader-${i}`;
      await until(`${writers[i]} gone`, async () =>
        (await lab.core.readNamespacedPod({ name: writers[i] as string, namespace: ns }).then(
          () => false,
          () => true,
        ))
          ? true
          : undefined,
      );
      await lab.core.createNamespacedPod({
        namespace: ns,
        body: workloadPod(reader, consumers[(i + 1) % consumers.length] as string, c, [
          "verify",
          `--bytes=${ROUND_BYTES}`,
          `--seed=${roundSeed(seeds[i] as string, r.round)}`,
          "--then-hold",
        ]),
      });
      const read = await waitHeld(lab, ns, reader, 300_000);
      expect(read).toMatchObject({ ok: true, sha256: r.sha256 });
    }
  } finally {
    if (drained)
      await storageNodes.mergePatch(drained, lab.namespace, { spec: { drain: null } }).catch(() => {});
    for (const c of clients) await c.close();
    await removeSuiteObjects(lab, ns, {
      pods: [...writers, ...claims.map((_, i) => `reader-${i}`)],
      claims,
      storageClass: sc,
    });
  }
}, 1_800_000);
