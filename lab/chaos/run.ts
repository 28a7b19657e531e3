// The seeded chaos run of replicated volumes: a world of storage nodes and a manager as processes
// (world.ts), replicated volumes placed by the manager, a consumer writing to each (writer.ts),
// and the seeded fault plan (fault-plan.ts) played against them one fault at a time (with
// `drains`, a drain of a storage node also stays asked for while the next faults go on). At the end
// every block is read back through the serving export, and each copy through its own export once
// all are Online at the volume's generation, and checked against the acknowledged-write log.
import { randomUUID } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  DRAINED,
  kinds,
  type NVMePartition,
  type NVMeVolumeAttachment,
  type RDMAStorageNode,
} from "../../api/index.ts";
import { CacheSet } from "../../lib/kube/cache-set.ts";
import { ResourceClient } from "../../lib/kube/resource.ts";
import { silentLogger } from "../../lib/log.ts";
import { attachmentNameFor, nexusHostNqnFor } from "../../lib/volume-identity.ts";
import type { TestCluster } from "../cluster/test-support.ts";
import { connectController, createFabric } from "../sim/spdk/fabric.ts";
import { describeFault, type Fault, faultPlan, type PlanOptions } from "./fault-plan.ts";
import { startWorld, type World } from "./world.ts";
import { BLOCK_BYTES, type BlockFinding, checkBlock } from "./write-log.ts";
import { VolumeWriter } from "./writer.ts";

const MiB = 1024 ** 2;
/** raid1 keeps the first MiB of each copy for its superblock: the volume's byte 0 is there. */
const COPY_DATA_OFFSET = 1 * MiB;
/** The volumes' failover bound (the API's minimum). */
const FAILOVER_AFTER_SECONDS = 5;

export interface ChaosOptions {
  tc: TestCluster;
  seed: number;
  faults: number;
  /** Other bounds for the plan's down times and gaps than its defaults (a short test run). */
  bounds?: Pick<PlanOptions, "nodeDownMs" | "processDownMs" | "gapMs">;
  /** One volume per entry, with that many copies (2 or 3). */
  volumes: readonly number[];
  /**
   * Drains among the faults (fault-plan's drainWeight 1), with one storage node more than the
   * copies need, so that every copy can move. Off: the plan of each seed is the one without drains.
   */
  drains?: boolean;
  /** Blocks of 4 KiB written per volume. */
  blocks?: number;
  depth?: number;
  /** A writer without an acknowledgement this long fails the run. */
  stallMs?: number;
  /** Bound on the copies' coming back Online at the volume's generation after the faults. */
  convergeMs?: number;
  say?: (line: string) => void;
  /** Keep the run's directory (process logs) even when it passes. */
  keepDir?: boolean;
  logLevel?: "debug" | "info" | "warn" | "error";
}

export interface VolumeResult {
  name: string;
  replicas: number;
  acknowledged: number;
  attempts: number;
  retries: number;
  timeouts: number;
  pathSwitches: number;
  longestWriteMs: number;
  failovers: number;
  rebuildsStarted: number;
  rebuildsCompleted: number;
  /** Copies the serving node recorded Faulted (lost while serving, past the degrade bound). */
  faulted: number;
  /** Blocks not holding their last acknowledged write or a later attempted one, served export. */
  lost: BlockFinding[];
  /** The same, per copy read through its own export, plus copies differing from the served bytes. */
  copyFindings: string[];
  copiesVerified: number;
  /** Set when the copies did not all come back Online at the volume's generation in time. */
  notConverged?: string;
}

export interface ChaosResult {
  seed: number;
  faults: number;
  /** Drains asked for, finished (Drained True) before they were cleared, and not started (another ran). */
  drains: { started: number; completed: number; skipped: number };
  faultsDuringRebuild: number;
  faultsOnServingNode: number;
  durationMs: number;
  volumes: VolumeResult[];
  lost: number;
  dir: string;
}

interface Tracked {
  name: string;
  replicas: number;
  uid: string;
  nqn: string;
  tag: number;
  writer: VolumeWriter;
  failovers: number;
  rebuildsStarted: number;
  rebuildsCompleted: number;
  faulted: number;
}

async function until<T>(fn: () => Promise<T | undefined | false>, ms: number, what: string): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await fn().catch(() => undefined);
    if (v !== undefined && v !== false) return v;
    if (Date.now() > deadline) throw new Error(`${what}: not within ${ms} ms`);
    await Bun.sleep(200);
  }
}

/** Runs the chaos run; rejects (with the seed in the message) when it cannot finish or loses data. */
export async function runChaos(o: ChaosOptions): Promise<ChaosResult> {
  const say = o.say ?? ((l: string) => console.log(l));
  const started = Date.now();
  const rerun = `rerun with DISTORT_CHAOS_SEED=${o.seed}`;
  say(`chaos: seed ${o.seed}, ${o.faults} faults, volumes with ${o.volumes.join(", ")} copies (${rerun})`);
  for (const r of o.volumes) if (r !== 2 && r !== 3) throw new Error(`a volume has 2 or 3 copies, got ${r}`);
  const nodes = Math.max(3, ...o.volumes) + (o.drains ? 1 : 0);
  const plan = faultPlan({
    seed: o.seed,
    faults: o.faults,
    nodes,
    ...o.bounds,
    drainWeight: o.drains ? 1 : 0,
  });
  const blocks = o.blocks ?? 256;
  const stallMs = o.stallMs ?? 120_000;
  const dir = mkdtempSync(join(tmpdir(), "distort-chaos-"));
  const ns = await o.tc.namespace("chaos");
  const port = 30000 + (o.seed % 5000);
  const world = await startWorld({
    dir,
    kubeconfigPath: o.tc.kubeconfigPath,
    namespace: ns,
    conn: o.tc.conn,
    nodes,
    port,
    stalenessMs: 4000,
    degradeAfterMs: 2000,
    rebuildMbPerSec: 16,
    addressOctet: 60 + (o.seed % 150),
    logLevel: o.logLevel,
  });
  say(`chaos: world in ${dir} (nodes ${world.nodes.map((n) => n.name).join(", ")}, port ${port})`);
  const fabric = createFabric(world.fabricDir);
  const parts = new ResourceClient(o.tc.conn, kinds.NVMePartition);
  const vas = new ResourceClient(o.tc.conn, kinds.NVMeVolumeAttachment);
  const addressOf = new Map(world.nodes.map((n) => [n.name, n.address]));
  const hostId = randomUUID();
  const hostnqn = `nqn.2014-08.org.nvmexpress:uuid:${hostId}`;
  const tracked: Tracked[] = [];
  const caches = new CacheSet(o.tc.conn, { logger: silentLogger });
  let passed = false;
  try {
    // The volumes, as CSI creates them: the manager places their copies and picks the serving node.
    for (const [i, replicas] of o.volumes.entries()) {
      await parts.create({
        apiVersion: "storage.distort.io/v1alpha1",
        kind: "NVMePartition",
        metadata: { name: `vol-${i}`, namespace: ns },
        spec: {
          sizeBytes: 32 * MiB,
          replicas,
          failoverAfterSeconds: FAILOVER_AFTER_SECONDS,
          backend: "spdk",
          volumeManager: "partition",
          targetOptions: { transport: "tcp" },
        },
      } as NVMePartition);
    }
    for (const [i, replicas] of o.volumes.entries()) {
      const name = `vol-${i}`;
      const v = await until(
        async () => {
          const p = await parts.get(name, ns);
          return p?.status?.state === "Exported" && p.spec.nodeName && p.status.nqn ? p : undefined;
        },
        120_000,
        `${name} placed, its copies Online and served`,
      );
      const uid = v.metadata.uid as string;
      // The consumer's admission, as ControllerPublish writes it.
      const vaName = attachmentNameFor(name, uid);
      await vas.create({
        apiVersion: "storage.distort.io/v1alpha1",
        kind: "NVMeVolumeAttachment",
        metadata: { name: vaName, namespace: ns },
        spec: {
          partitionName: name,
          partitionUID: uid,
          nodeId: `chaos-consumer/${hostnqn}`,
          hostNQN: hostnqn,
          attachmentId: `att-${name}`,
        },
      } as NVMeVolumeAttachment);
      await until(
        async () => (await vas.get(vaName, ns))?.status?.observedAttachmentId === `att-${name}`,
        30_000,
        `consumer admitted to ${name}`,
      );
      // With drains a copy can move to any node: the writer keeps a path to every one.
      const addresses = o.drains
        ? world.nodes.map((n) => n.address)
        : (v.status?.replicas ?? []).map((r) => addressOf.get(r.nodeName ?? "") as string);
      const tag = (o.seed * 31 + i) >>> 0;
      const writer = new VolumeWriter({
        fabric,
        nqn: v.status?.nqn as string,
        hostnqn,
        hostid: hostId,
        addresses,
        port,
        blocks,
        depth: o.depth ?? 4,
        tag,
        writeTimeoutMs: 60_000,
        katoMs: 3000,
      });
      tracked.push({
        name,
        replicas,
        uid,
        nqn: v.status?.nqn as string,
        tag,
        writer,
        failovers: 0,
        rebuildsStarted: 0,
        rebuildsCompleted: 0,
        faulted: 0,
      });
      say(`chaos: ${name} (${replicas} copies on ${addresses.join(", ")}) served by ${v.spec.nodeName}`);
    }
    // Every stored version of each volume: failovers (a new serving node) and rebuilds.
    const latest = new Map<string, NVMePartition>();
    const watched = caches.cache(kinds.NVMePartition, { namespace: ns });
    const note = (old: NVMePartition | undefined, v: NVMePartition) => {
      const t = tracked.find((x) => x.uid === v.metadata.uid);
      if (!t) return;
      latest.set(t.name, v);
      if (!old) return;
      if (old.spec.nodeName && v.spec.nodeName && old.spec.nodeName !== v.spec.nodeName) {
        t.failovers++;
        say(
          `chaos:   ${t.name} failed over ${old.spec.nodeName} -> ${v.spec.nodeName} (generation ${v.status?.dataGeneration})`,
        );
      }
      for (const r of v.status?.replicas ?? []) {
        const before = old.status?.replicas?.find((e) => e.name === r.name)?.state;
        if (r.state === "Rebuilding" && before !== "Rebuilding") t.rebuildsStarted++;
        if (r.state === "Faulted" && before !== "Faulted") t.faulted++;
        if (r.state === "Online" && before === "Rebuilding") {
          t.rebuildsCompleted++;
          say(`chaos:   ${t.name} rebuilt ${r.name} (generation ${r.generation})`);
        }
      }
    };
    watched.on({ add: (v) => note(undefined, v), update: note });
    await caches.start();
    for (const t of tracked) t.writer.start();
    await until(
      async () => tracked.every((t) => t.writer.stats.acknowledged > 0),
      60_000,
      "first writes acknowledged",
    );

    let faultsDuringRebuild = 0;
    let faultsOnServingNode = 0;
    // One drain at a time, asked for until its time is up, while the next faults go on.
    const storageNodes = new ResourceClient<RDMAStorageNode>(o.tc.conn, kinds.RDMAStorageNode);
    const drains = { started: 0, completed: 0, skipped: 0 };
    let drain: { node: string; endAt: number; n: number; startedAt: number } | undefined;
    const endDrain = async (force: boolean) => {
      if (!drain || (!force && Date.now() < drain.endAt)) return;
      const n = await storageNodes.get(drain.node, ns).catch(() => undefined);
      const c = n?.status?.conditions?.find((x) => x.type === DRAINED);
      const done = c?.status === "True";
      if (done) drains.completed++;
      await storageNodes.mergePatch(drain.node, ns, { spec: { drain: null } });
      say(
        `chaos:   drain ${drain.n} of ${drain.node} cleared after ${((Date.now() - drain.startedAt) / 1000).toFixed(1)} s: ${done ? "Drained" : `${c?.reason}: ${c?.message}`}`,
      );
      drain = undefined;
    };
    const check = () => {
      const exits = world.unexpectedExits();
      if (exits.length > 0) throw new Error(`processes ended on their own: ${exits.join("; ")}`);
      for (const t of tracked) {
        const quiet = Date.now() - t.writer.lastAckAt;
        if (quiet > stallMs) throw new Error(`${t.name}: no write acknowledged for ${quiet} ms`);
      }
    };
    for (const f of plan) {
      check();
      await endDrain(false);
      const vols = [...latest.values()];
      if (vols.some((v) => v.status?.replicas?.some((r) => r.state === "Rebuilding"))) faultsDuringRebuild++;
      const hit = f.target.kind === "node" ? world.nodes[f.target.index]?.name : undefined;
      if (
        hit &&
        f.target.kind === "node" &&
        f.target.action !== "agent" &&
        vols.some((v) => v.spec.nodeName === hit)
      )
        faultsOnServingNode++;
      say(
        `chaos: ${describeFault(
          f,
          world.nodes.map((n) => n.name),
        )} [acked ${tracked.map((t) => t.writer.stats.acknowledged).join("/")}]`,
      );
      if (f.target.kind === "drain") {
        const node = world.nodes[f.target.index]?.name as string;
        if (drain) {
          drains.skipped++;
          say(`chaos:   drain of ${node} not started: ${drain.node} still drains`);
        } else {
          await storageNodes.mergePatch(node, ns, { spec: { drain: true } });
          drains.started++;
          drain = { node, endAt: Date.now() + f.downMs, n: f.n, startedAt: Date.now() };
        }
      } else await inject(world, f);
      await Bun.sleep(f.gapMs);
    }
    await endDrain(true);
    check();
    say("chaos: faults done; waiting for the writers' last writes");
    await Promise.race([
      Promise.all(tracked.map((t) => t.writer.stop())),
      Bun.sleep(stallMs).then(() => {
        throw new Error(`writers did not finish their last writes within ${stallMs} ms`);
      }),
    ]);

    // Verification, by I/O: the serving export first, then each copy through its own export.
    const results: VolumeResult[] = [];
    for (const t of tracked) {
      say(`chaos: verifying ${t.name} through its serving export`);
      const path = await t.writer.servingPath(stallMs);
      const served = await bounded(
        path.ctrl.read(path.nsid, 0, blocks * BLOCK_BYTES),
        30_000,
        `${t.name}: read of the served export`,
      );
      const lost: BlockFinding[] = [];
      for (let b = 0; b < blocks; b++) {
        const finding = checkBlock(
          t.writer.log,
          t.tag,
          b,
          served.subarray(b * BLOCK_BYTES, (b + 1) * BLOCK_BYTES),
        );
        if (finding) lost.push(finding);
      }
      const copyFindings: string[] = [];
      const converged = async () => {
        const p = await parts.get(t.name, ns);
        const g = p?.status?.dataGeneration;
        const rs = p?.status?.replicas ?? [];
        return rs.length === t.replicas && rs.every((r) => r.state === "Online" && r.generation === g)
          ? p
          : undefined;
      };
      let v: NVMePartition;
      let notConverged: string | undefined;
      try {
        v = await until(
          converged,
          o.convergeMs ?? 240_000,
          `${t.name}: every copy Online at the volume's generation`,
        );
      } catch (err) {
        // Not a loss, a liveness failure: reported; the copies that are current are still read.
        v = (await parts.get(t.name, ns)) as NVMePartition;
        const rs = (v.status?.replicas ?? []).map(
          (r) => `${r.name}@${r.nodeName}=${r.state}/g${r.generation}${r.message ? ` (${r.message})` : ""}`,
        );
        notConverged = `${String(err)}; generation ${v.status?.dataGeneration}: ${rs.join(", ")}`;
        say(`chaos: ${t.name} DID NOT CONVERGE: ${notConverged}`);
      }
      say(`chaos: verifying ${t.name}'s copies through their own exports`);
      let copiesVerified = 0;
      const g = v.status?.dataGeneration;
      for (const r of v.status?.replicas ?? []) {
        if (r.state !== "Online" || r.generation !== g) continue;
        const copy = await parts.get(r.name, ns);
        const reader = await connectController(fabric, {
          trtype: "TCP",
          traddr: copy?.status?.portalIP as string,
          trsvcid: String(copy?.status?.portalPort ?? port),
          subnqn: copy?.status?.nqn as string,
          hostnqn: nexusHostNqnFor(v.spec.nodeName as string),
          hostid: randomUUID(),
        });
        try {
          const got = await bounded(
            reader.read(1, COPY_DATA_OFFSET, blocks * BLOCK_BYTES),
            30_000,
            `read of copy ${r.name}`,
          );
          for (let b = 0; b < blocks; b++) {
            const slice = got.subarray(b * BLOCK_BYTES, (b + 1) * BLOCK_BYTES);
            const finding = checkBlock(t.writer.log, t.tag, b, slice);
            if (finding) copyFindings.push(`${r.name} block ${b}: ${finding.found} (acked ${finding.acked})`);
            else if (!slice.equals(served.subarray(b * BLOCK_BYTES, (b + 1) * BLOCK_BYTES)))
              copyFindings.push(`${r.name} block ${b}: differs from the served bytes`);
          }
          copiesVerified++;
        } finally {
          reader.close();
        }
      }
      const s = t.writer.stats;
      results.push({
        name: t.name,
        replicas: t.replicas,
        acknowledged: s.acknowledged,
        attempts: s.attempts,
        retries: s.retries,
        timeouts: s.timeouts,
        pathSwitches: s.pathSwitches,
        longestWriteMs: s.longestWriteMs,
        failovers: t.failovers,
        rebuildsStarted: t.rebuildsStarted,
        rebuildsCompleted: t.rebuildsCompleted,
        faulted: t.faulted,
        lost,
        copyFindings,
        copiesVerified,
        ...(notConverged ? { notConverged } : {}),
      });
    }
    const result: ChaosResult = {
      seed: o.seed,
      faults: plan.length,
      drains,
      faultsDuringRebuild,
      faultsOnServingNode,
      durationMs: Date.now() - started,
      volumes: results,
      lost: results.reduce((n, r) => n + r.lost.length + r.copyFindings.length, 0),
      dir,
    };
    say(summary(result));
    passed = result.lost === 0 && results.every((r) => !r.notConverged);
    if (result.lost > 0) say(`chaos: FAILED: acknowledged writes lost, ${rerun}; process logs in ${dir}`);
    else if (!passed)
      say(`chaos: FAILED to converge (no acknowledged write lost), ${rerun}; process logs in ${dir}`);
    return result;
  } catch (err) {
    for (const t of tracked) {
      say(`chaos:   ${t.name} writer: ${t.writer.describe()}`);
      const v = await parts.get(t.name, ns).catch(() => undefined);
      const rs = (v?.status?.replicas ?? []).map(
        (r) => `${r.name}@${r.nodeName}=${r.state}/g${r.generation}`,
      );
      const conds = (v?.status?.conditions ?? []).map(
        (c) => `${c.type}=${c.status} ${c.reason}: ${c.message}`,
      );
      say(
        `chaos:   ${t.name}: served by ${v?.spec.nodeName}, state ${v?.status?.state}, generation ${v?.status?.dataGeneration}, copies ${rs.join(" ")}; ${conds.join("; ")}`,
      );
    }
    const storageNodes = await new ResourceClient(o.tc.conn, kinds.RDMAStorageNode)
      .list({ namespace: ns })
      .catch(() => undefined);
    for (const n of storageNodes?.items ?? []) {
      const hb = n.status?.lastHeartbeatTime;
      const age = hb ? `${Date.now() - Date.parse(hb)} ms ago` : "never";
      const conds = (n.status?.conditions ?? []).map((c) => `${c.type}=${c.status} ${c.reason}`);
      say(`chaos:   storage node ${n.metadata.name}: heartbeat ${age}; ${conds.join(", ")}`);
    }
    const admissions = await vas.list({ namespace: ns }).catch(() => undefined);
    for (const a of admissions?.items ?? [])
      say(
        `chaos:   attachment ${a.spec.partitionName}: host ${a.spec.hostNQN.split(":").pop()} id ${a.spec.attachmentId} observed ${a.status?.observedAttachmentId}`,
      );
    say(`chaos: FAILED (${String(err)}), ${rerun}; process logs in ${dir}`);
    throw new Error(`${String(err)} (${rerun})`);
  } finally {
    await caches.stop().catch(() => {});
    for (const t of tracked) t.writer.close();
    await world.stop();
    if (passed && !o.keepDir) rmSync(dir, { recursive: true, force: true });
  }
}

async function bounded<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  try {
    return await Promise.race([
      p,
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error(`${what}: no answer within ${ms} ms`)), ms);
      }),
    ]);
  } finally {
    clearTimeout(timer);
  }
}

async function inject(world: World, f: Fault): Promise<void> {
  const t = f.target;
  if (t.kind === "manager") {
    await world.killManager();
    await Bun.sleep(f.downMs);
    await world.startManager();
    return;
  }
  if (t.kind === "drain") throw new Error("a drain is started by the run's loop, not injected");
  const i = t.index;
  if (t.action === "agent") {
    await world.killAgent(i);
    await Bun.sleep(f.downMs);
    await world.startAgent(i);
  } else if (t.action === "target") {
    await world.killTarget(i);
    await Bun.sleep(f.downMs);
    await world.startTarget(i);
  } else {
    await Promise.all([world.killAgent(i), world.killTarget(i)]);
    await Bun.sleep(f.downMs);
    await world.startTarget(i);
    await world.startAgent(i);
  }
}

/** The run's figures, one block of text. */
export function summary(r: ChaosResult): string {
  const lines = [
    `chaos: seed ${r.seed}: ${r.faults} faults in ${(r.durationMs / 1000).toFixed(0)} s (${r.faultsOnServingNode} on a serving node's target, ${r.faultsDuringRebuild} during a rebuild; drains ${r.drains.started} started, ${r.drains.completed} finished, ${r.drains.skipped} not started)`,
  ];
  for (const v of r.volumes)
    lines.push(
      `chaos:   ${v.name} (${v.replicas} copies): ${v.acknowledged} writes acknowledged (${v.attempts} sent, ${v.retries} retried, ${v.timeouts} timed out, longest ${v.longestWriteMs} ms), ${v.failovers} failovers, ${v.faulted} copies faulted, ${v.rebuildsStarted} rebuilds started / ${v.rebuildsCompleted} completed, ${v.copiesVerified} copies verified; lost ${v.lost.length}, copy findings ${v.copyFindings.length}`,
      ...v.lost
        .slice(0, 20)
        .map(
          (l) =>
            `chaos:     LOST block ${l.block}: holds ${l.found}, acknowledged ${l.acked}, attempted ${l.attempted}`,
        ),
      ...v.copyFindings.slice(0, 20).map((l) => `chaos:     COPY ${l}`),
      ...(v.notConverged ? [`chaos:     NOT CONVERGED ${v.notConverged}`] : []),
    );
  const acked = r.volumes.reduce((n, v) => n + v.acknowledged, 0);
  const fo = r.volumes.reduce((n, v) => n + v.failovers, 0);
  const rb = r.volumes.reduce((n, v) => n + v.rebuildsCompleted, 0);
  lines.push(
    `chaos: total: ${r.faults} faults, ${acked} writes acknowledged, ${fo} failovers, ${rb} rebuilds, lost ${r.lost}`,
  );
  return lines.join("\n");
}
