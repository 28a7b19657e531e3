// CreateVolume latency through the real CSI controller, manager and agent (chart identities, a real
// kube-apiserver, simulated drives): N calls at concurrency 1, then N at 16. Floor (same run): the
// API writes one volume needs in sequence times the API server's write latency. Run: bun bench/provisioning.bench.ts [n]
import { randomUUID } from "node:crypto";
import type { MessageInitShape } from "@bufbuild/protobuf";
import * as k8s from "@kubernetes/client-node";
import { PARTITION_FINALIZER } from "../agent/partitions/decide.ts";
import { kinds, type NVMeDevice, type NVMePartition } from "../api/index.ts";
import {
  VolumeCapability_AccessMode_Mode as AccessMode,
  Controller,
  type CreateVolumeRequestSchema,
} from "../gen/csi/v1/csi_pb.ts";
import { startControlPlane } from "../lab/cluster/control-plane.ts";
import { startStack } from "../lab/harness/stack.ts";
import { GrpcJsClient } from "../lib/grpc/grpc-js-client.ts";
import { WatchCache } from "../lib/kube/cache.ts";
import { ResourceClient } from "../lib/kube/resource.ts";
import { createLogger } from "../lib/log.ts";
import { forCreate, partition } from "../manager/testdata/fixtures.ts";
import { cpuSeconds, machineBusySeconds, pool } from "./proc-stats.ts";
import { type Figure, fmt, median, percentile, svgHistogram, writeResult } from "./report.ts";

const N = Number(process.argv[2] ?? 200);
const CONCURRENCY = [1, 16] as const;
const MiB = 1024 ** 2;
const GiB = 1024 ** 3;
const VOLUME_BYTES = 64 * MiB;
/** Sequential writes per kind when measuring the API server's write latency. */
const WRITE_SAMPLES = 100;
const CALL_TIMEOUT_MS = 120_000;
const SVG = new URL("../docs/provisioning-latency.svg", import.meta.url).pathname;
const say = (s: string) => process.stdout.write(`${s}\n`);

/**
 * The API writes on one volume's critical path, each waiting for the one before (a watch carries
 * each to the next writer). Reads on the path (CSI's GET of the partition, the manager's GETs of
 * claim and node, the agent's GET before each status write) are not counted: the floor is writes.
 */
const CRITICAL_WRITES = [
  "csi-controller: POST nvmepartitions (CreateVolume)",
  "manager: PUT nvmedevices/status (ledger entry, resourceVersion-guarded)",
  "manager: PATCH nvmepartitions (spec.nodeName/deviceSerial/claimRef)",
  "agent: PATCH nvmepartitions (cleanup finalizer, before any external state)",
  "agent: PUT nvmepartitions/status (state Provisioning)",
  "agent: PUT nvmepartitions/status (state Exported, Ready=True) -> CSI replies",
];

/** The StorageClass parameters of the chart's example distort-spdk-lvol class, as the external-provisioner passes them. */
const PARAMETERS: Record<string, string> = {
  backend: "spdk",
  volumeManager: "spdk-lvol",
  transport: "rdma",
  ctrlLossTmo: "600",
  reconnectDelay: "10",
  fastIoFailTmo: "30",
};

const ms = (x: number) => `${x.toFixed(x < 10 ? 1 : 0)} ms`;

/** Warnings and errors of the in-process components, counted by controller, message and error kind. */
const trouble = new Map<string, { n: number; retryMs: number }>();
const logger = createLogger({
  level: "warn",
  sink: (line) => {
    const l = JSON.parse(line) as Record<string, unknown>;
    // Object names and numbers vary per volume; without them the lines group by cause.
    const err = typeof l.err === "string" ? l.err.replace(/pvc-[0-9a-f-]+|[0-9a-f-]{36}|\d+/g, "#") : "";
    const repaired = Array.isArray(l.repaired) ? `repaired ${l.repaired.join("+")}` : "";
    const key = [l.component, l.controller, l.msg, l.errKind, err.slice(0, 110), repaired]
      .filter(Boolean)
      .join(" | ");
    const t = trouble.get(key) ?? { n: 0, retryMs: 0 };
    t.n++;
    t.retryMs += typeof l.retryInMs === "number" ? l.retryInMs : 0;
    trouble.set(key, t);
  },
});

const cp = await startControlPlane({ progress: (l) => say(`  ${l}`) });
const figures: Figure[] = [];
const notes: string[] = [];
const profile: string[] = [];
try {
  // One storage node: the harness gives every simulated node the same portal (127.0.0.1:4420) on
  // one simulated fabric, so a second node's listeners could not bind.
  const drives = [0, 1, 2, 3].map((d) => ({
    serial: `PROV${d}000000001`,
    pciAddress: `0000:${(0x3b + d).toString(16)}:00.0`,
    sizeBytes: 64 * GiB,
  }));
  const stack = await startStack({
    kubeconfigPath: cp.kubeconfigPath,
    storageNodes: [{ name: "storage-1", drives }],
    consumerNodes: [],
    csiAllInOne: true,
    identities: "chart-service-accounts",
    logger,
    fast: true,
  });
  try {
    const ns = stack.namespace;
    const controller = stack.csiController;
    if (!controller) throw new Error("the CSI controller did not start");
    say(
      `stack up (${[...stack.identity.values()].map((i) => i.component).join(", ")} as chart ServiceAccounts)`,
    );
    // Claims are bound by the manager; volumes placed before that would only wait.
    const claimed = async () =>
      (await stack.devices()).filter((d) => d.status?.phase === "Claimed" && d.status.claimRef).length;
    for (const deadline = Date.now() + 60_000; (await claimed()) < 4; await Bun.sleep(100))
      if (Date.now() > deadline) throw new Error("drives were not claimed within 60 s");

    // --- stage timestamps, as a watcher sees them (ms resolution, unlike managedFields) ---
    const parts = new ResourceClient(stack.conn, kinds.NVMePartition);
    type Stage = "created" | "ledger" | "assigned" | "scheduled" | "finalizer" | "provisioning" | "exported";
    const stages = new Map<string, Partial<Record<Stage, number>> & { uid?: string }>();
    const ledgerAt = new Map<string, number>();
    const mark = (name: string, s: Stage, t: number) => {
      const rec = stages.get(name) ?? {};
      if (rec[s] === undefined) rec[s] = t;
      stages.set(name, rec);
    };
    const watchParts = new WatchCache(parts, { namespace: ns, logger });
    const onPartition = (p: NVMePartition) => {
      const t = performance.now();
      const name = p.metadata.name;
      mark(name, "created", t);
      const rec = stages.get(name) as NonNullable<ReturnType<typeof stages.get>>;
      rec.uid ??= p.metadata.uid;
      if (p.spec.nodeName) mark(name, "assigned", t);
      if (p.status?.conditions?.some((c) => c.type === "Scheduled" && c.status === "True"))
        mark(name, "scheduled", t);
      if (p.metadata.finalizers?.includes(PARTITION_FINALIZER)) mark(name, "finalizer", t);
      const state = p.status?.state;
      if (state === "Provisioning" || state === "Exported") mark(name, "provisioning", t);
      if (state === "Exported") mark(name, "exported", t);
    };
    watchParts.on({ add: onPartition, update: (_o, p) => onPartition(p) });
    const watchDevices = new WatchCache(new ResourceClient(stack.conn, kinds.NVMeDevice), { logger });
    const onDevice = (d: NVMeDevice) => {
      const t = performance.now();
      for (const r of d.status?.reservations ?? []) if (!ledgerAt.has(r.uid)) ledgerAt.set(r.uid, t);
    };
    watchDevices.on({ add: onDevice, update: (_o, d) => onDevice(d) });
    await Promise.all([watchParts.start(), watchDevices.start()]);

    const client = new GrpcJsClient(controller.address);
    const request = (name: string): MessageInitShape<typeof CreateVolumeRequestSchema> => ({
      name,
      capacityRange: { requiredBytes: BigInt(VOLUME_BYTES) },
      volumeCapabilities: [
        {
          accessType: { case: "mount", value: { fsType: "ext4", mountFlags: [] } },
          accessMode: { mode: AccessMode.SINGLE_NODE_WRITER },
        },
      ],
      parameters: {
        ...PARAMETERS,
        // What --extra-create-metadata adds (the chart sets it).
        "csi.storage.k8s.io/pvc/name": `claim-${name.slice(4, 12)}`,
        "csi.storage.k8s.io/pvc/namespace": "default",
        "csi.storage.k8s.io/pv/name": name,
      },
    });

    interface Round {
      conc: number;
      lat: number[];
      wallMs: number;
      ids: string[];
      names: string[];
      calls: Map<string, { t0: number; t1: number }>;
      failures: string[];
      /** CPU seconds during the round: this process (manager, agent, CSI, SPDK emulator), apiserver, etcd, machine. */
      cpu: { self: number; api: number; etcd: number; machine: number };
      /** The agent's partition controller during the round: reconciles, their seconds, queue adds. */
      agent: { reconciles: number; seconds: number; adds: number };
    }
    /** The agent's partition-controller counters so far, from its /metrics endpoint. */
    const agentSeries = async (): Promise<Round["agent"]> => {
      const port = stack.agents[0]?.healthPort;
      const text = port ? await (await fetch(`http://127.0.0.1:${port}/metrics`)).text() : "";
      const sum = (name: string) =>
        text
          .split("\n")
          .filter((l) => l.startsWith(`${name}{`) && l.includes('controller="partitions"'))
          .reduce((a, l) => a + Number(l.slice(l.lastIndexOf(" ") + 1)), 0);
      return {
        reconciles: sum("distort_reconcile_total"),
        seconds: sum("distort_reconcile_duration_seconds_sum"),
        adds: sum("distort_workqueue_adds_total"),
      };
    };
    const [etcdPid, apiPid] = cp.pids();
    const cpuNow = () => ({
      self: cpuSeconds(process.pid),
      api: cpuSeconds(apiPid),
      etcd: cpuSeconds(etcdPid),
      machine: machineBusySeconds(),
    });
    const create = async (conc: number, n: number): Promise<Round> => {
      const names = Array.from({ length: n }, () => `pvc-${randomUUID()}`);
      const r: Round = {
        conc,
        lat: [],
        wallMs: 0,
        ids: [],
        names,
        calls: new Map(),
        failures: [],
        cpu: { self: 0, api: 0, etcd: 0, machine: 0 },
        agent: { reconciles: 0, seconds: 0, adds: 0 },
      };
      const a0 = await agentSeries();
      const c0 = cpuNow();
      const w0 = performance.now();
      await pool(names, conc, async (name) => {
        const t0 = performance.now();
        try {
          const res = await client.unary(Controller.method.createVolume, request(name), {
            timeoutMs: CALL_TIMEOUT_MS,
          });
          const t1 = performance.now();
          r.lat.push(t1 - t0);
          r.calls.set(name, { t0, t1 });
          if (res.volume?.volumeId) r.ids.push(res.volume.volumeId);
        } catch (err) {
          r.failures.push(`${name}: ${err instanceof Error ? err.message : String(err)}`);
        }
      });
      r.wallMs = performance.now() - w0;
      const c1 = cpuNow();
      const a1 = await agentSeries();
      r.agent = {
        reconciles: a1.reconciles - a0.reconciles,
        seconds: a1.seconds - a0.seconds,
        adds: a1.adds - a0.adds,
      };
      r.cpu = {
        self: c1.self - c0.self,
        api: c1.api - c0.api,
        etcd: c1.etcd - c0.etcd,
        machine: c1.machine - c0.machine,
      };
      return r;
    };
    /** Deletes through CSI (DeleteVolume waits for the agent's cleanup), then waits for empty ledgers. */
    const clean = async (ids: string[]): Promise<number> => {
      const c0 = performance.now();
      await pool(ids, 16, async (volumeId) => {
        await client.unary(Controller.method.deleteVolume, { volumeId }, { timeoutMs: CALL_TIMEOUT_MS });
      });
      for (const deadline = Date.now() + 180_000; ; await Bun.sleep(200)) {
        const left = (await parts.list({ namespace: ns })).items.length;
        const held = (await stack.devices()).reduce((s, d) => s + (d.status?.reservations?.length ?? 0), 0);
        if (left === 0 && held === 0) break;
        if (Date.now() > deadline)
          throw new Error(`cleanup stuck: ${left} partitions, ${held} ledger entries left`);
      }
      return performance.now() - c0;
    };

    // Warm-up (not measured): locks every drive to the spdk backend and warms the code paths.
    const warm = await create(4, 8);
    if (warm.failures.length) throw new Error(`warm-up failed: ${warm.failures[0]}`);
    await clean(warm.ids);
    say("warm-up done");

    const rounds: Round[] = [];
    for (const conc of CONCURRENCY) {
      const r = await create(conc, N);
      rounds.push(r);
      say(
        `c=${conc}: ${r.lat.length}/${N} ok in ${(r.wallMs / 1000).toFixed(1)} s; p50 ${ms(median(r.lat))}`,
      );
      if (r.failures.length) say(`  ${r.failures.length} failed, first: ${r.failures[0]}`);
      const cleanMs = await clean(r.ids);
      say(`  deleted and cleaned in ${(cleanMs / 1000).toFixed(1)} s`);
    }

    // --- the API server's write latency, same run, idle system ---
    const wns = `bench-writes-${randomUUID().slice(0, 6)}`;
    const core = stack.conn.api(k8s.CoreV1Api);
    await core.createNamespace({ body: { metadata: { name: wns } } });
    const cmLat: number[] = [];
    for (let i = 0; i < WRITE_SAMPLES; i++) {
      const t0 = performance.now();
      await core.createNamespacedConfigMap({
        namespace: wns,
        body: { metadata: { name: `w${i}` }, data: { k: "v" } },
      });
      cmLat.push(performance.now() - t0);
    }
    // A placed partition on a node no agent serves: the manager only marks it Scheduled once.
    await parts.create(
      forCreate(partition(wns, "write-probe", { node: "bench-nowhere", serial: "NOWHERE", size: GiB })),
    );
    const crLat: number[] = [];
    for (let i = 0; i < WRITE_SAMPLES; i++) {
      const t0 = performance.now();
      await parts.mergePatch("write-probe", wns, { metadata: { annotations: { "bench/n": String(i) } } });
      crLat.push(performance.now() - t0);
    }
    await parts.delete("write-probe", wns);
    await core.deleteNamespace({ name: wns });
    const writeP50 = median(crLat);
    const floor = CRITICAL_WRITES.length * writeP50;
    say(
      `API write latency p50: custom resource merge-patch ${ms(writeP50)}, ConfigMap create ${ms(median(cmLat))}`,
    );
    say(`floor: ${CRITICAL_WRITES.length} sequential writes x ${ms(writeP50)} = ${ms(floor)}`);

    // --- figures ---
    for (const r of rounds) {
      const p50 = percentile(r.lat, 50);
      const p99 = percentile(r.lat, 99);
      const ratio = p50 / floor;
      figures.push(
        {
          id: `c${r.conc}-p50`,
          label: `CreateVolume p50, concurrency ${r.conc}`,
          value: Math.round(p50),
          unit: "ms",
          better: "lower",
          yardstick: {
            label: `floor: ${CRITICAL_WRITES.length} writes x p50 write`,
            value: Math.round(floor),
            unit: "ms",
          },
          ratio: Number(ratio.toFixed(2)),
          ratioLabel: "x floor",
          target: { text: "p50 within 4x floor", met: ratio <= 4 },
        },
        {
          id: `c${r.conc}-p99`,
          label: `CreateVolume p99, concurrency ${r.conc}`,
          value: Math.round(p99),
          unit: "ms",
          better: "lower",
        },
        {
          id: `c${r.conc}-rate`,
          label: `volumes/s, concurrency ${r.conc}`,
          value: Number((r.lat.length / (r.wallMs / 1000)).toFixed(1)),
          unit: "volumes/s",
          better: "higher",
        },
      );
      say(
        `c=${r.conc}: p50 ${ms(p50)}, p99 ${ms(p99)}, ${(r.lat.length / (r.wallMs / 1000)).toFixed(1)} volumes/s, p50/floor ${ratio.toFixed(2)}`,
      );
      if (r.failures.length)
        notes.push(`c=${r.conc}: ${r.failures.length} calls failed, e.g. ${r.failures[0]}`);
    }
    figures.push(
      {
        id: "api-write-p50",
        label: "API server write latency p50 (custom resource merge-patch, sequential)",
        value: Number(writeP50.toFixed(1)),
        unit: "ms",
        better: "lower",
      },
      {
        id: "floor",
        label: `floor: ${CRITICAL_WRITES.length} sequential writes x write p50`,
        value: Math.round(floor),
        unit: "ms",
        better: "lower",
      },
    );
    notes.push(
      `Floor counts ${CRITICAL_WRITES.length} sequential API writes per volume: ${CRITICAL_WRITES.join("; ")}.`,
      "Off the critical path: the manager's Scheduled=True status write (concurrent with the agent's writes), Events, and the capacity controller.",
      `Write latency: p50 of ${WRITE_SAMPLES} sequential merge-patches of one NVMePartition (admin token, idle stack, after the rounds); ConfigMap create p50 ${ms(median(cmLat))} for comparison.`,
      `Volumes: ${VOLUME_BYTES / MiB} MiB, parameters of the chart's distort-spdk-lvol StorageClass (spdk, spdk-lvol, rdma, ext4), 1 storage node with 4 simulated 64 GiB drives, one consumer-less CSI controller; manager, agents and CSI run in this process (the lab harness), etcd and kube-apiserver as their own processes.`,
      "The harness's `fast` mode is on: agents report every 1 s and re-verify exports every 5 s (production: 60 s); placement backoff 200 ms..2 s.",
      `Each round's volumes are deleted through DeleteVolume and the ledgers checked empty before the next round; a warm-up of 8 volumes (drive backend locks) is not counted.`,
    );

    // --- where the time goes: per-stage medians from the watcher's timestamps ---
    const stageNames: [Stage | "reply", string][] = [
      ["created", "call -> partition created (CSI GET+POST, watch)"],
      ["ledger", "created -> ledger entry (manager queue, GET claim+node, PUT device status)"],
      ["assigned", "ledger -> spec assigned (PATCH partition)"],
      ["finalizer", "assigned -> finalizer (agent watch, queue, PATCH partition)"],
      ["provisioning", "finalizer -> Provisioning (agent GET+PUT status)"],
      ["exported", "Provisioning -> Exported (SPDK lvol, subsystem, listener, ACL; GET+PUT status)"],
      ["reply", "Exported -> reply (CSI watch, reply)"],
    ];
    const breakdown = (r: Round) => {
      const per = new Map<string, number[]>(stageNames.map(([s]) => [s, []]));
      const scheduledAfterAssign: number[] = [];
      for (const name of r.names) {
        const call = r.calls.get(name);
        const s = stages.get(name);
        if (!call || !s) continue;
        const ledger = s.uid ? ledgerAt.get(s.uid) : undefined;
        const seq = [
          call.t0,
          s.created,
          ledger,
          s.assigned,
          s.finalizer,
          s.provisioning,
          s.exported,
          call.t1,
        ];
        if (seq.some((x) => x === undefined)) continue;
        const t = seq as number[];
        stageNames.forEach(([k], i) => {
          per.get(k)?.push(Math.max(0, (t[i + 1] as number) - (t[i] as number)));
        });
        if (s.scheduled !== undefined && s.assigned !== undefined)
          scheduledAfterAssign.push(s.scheduled - s.assigned);
      }
      const n = per.get("created")?.length ?? 0;
      const inOrder = r.names.flatMap((x) => {
        const c = r.calls.get(x);
        return c ? [c.t1 - c.t0] : [];
      });
      const q = Math.max(1, Math.floor(inOrder.length / 4));
      const sec = r.wallMs / 1000;
      const lines = [
        `c=${r.conc}: CPU over the ${sec.toFixed(1)} s round: this process (manager, agent, CSI, SPDK emulator, on one thread) ${r.cpu.self.toFixed(1)} s (${((100 * r.cpu.self) / sec).toFixed(0)}% of a core), kube-apiserver ${r.cpu.api.toFixed(1)} s, etcd ${r.cpu.etcd.toFixed(1)} s, machine ${r.cpu.machine.toFixed(1)} of ${(2 * sec).toFixed(0)} core-seconds.`,
        `c=${r.conc}: call latency p50 of the first ${q} calls ${ms(median(inOrder.slice(0, q)))}, of the last ${q} ${ms(median(inOrder.slice(-q)))} (exported volumes, re-verified every 5 s, accumulate during a round).`,
        `c=${r.conc}: the agent's partition controller ran ${r.agent.reconciles} reconciles (${(r.agent.reconciles / Math.max(1, r.lat.length)).toFixed(1)} per new volume, which itself needs about 3), ${r.agent.seconds.toFixed(1)} s of reconcile time over its 4 workers; queue adds ${r.agent.adds}.`,
        `c=${r.conc}: median per stage over ${n} volumes (watcher timestamps):`,
      ];
      for (const [k, label] of stageNames) {
        const xs = per.get(k) ?? [];
        if (xs.length) lines.push(`  ${label}: ${ms(median(xs))} (p90 ${ms(percentile(xs, 90))})`);
      }
      if (scheduledAfterAssign.length)
        lines.push(
          `  (off path) assigned -> manager's Scheduled=True status: ${ms(median(scheduledAfterAssign))}`,
        );
      return lines;
    };
    const missed = figures.some((f) => f.target && !f.target.met);
    const where = rounds.flatMap(breakdown);
    const troubleLines = [...trouble]
      .sort((a, b) => b[1].n - a[1].n)
      .slice(0, 12)
      .map(
        ([k, t]) =>
          `  ${t.n}x ${k}${t.retryMs ? ` (retry delays ${Math.round(t.retryMs)} ms in total)` : ""}`,
      );
    const diag = [
      ...where,
      troubleLines.length ? "component warnings during the run:" : "no component warnings during the run",
      ...troubleLines,
    ];
    if (missed) profile.push(...diag);
    else notes.push(...diag);
    say("");
    for (const l of diag) say(l);

    // --- latency distributions ---
    await Bun.write(SVG, stackedHistograms(rounds, floor));
    notes.push("Latency histograms: docs/provisioning-latency.svg.");

    await Promise.all([watchParts.stop(), watchDevices.stop()]);
    client.close();
  } finally {
    await stack.stop();
  }
  writeResult({ bench: "provisioning", figures, notes, ...(profile.length ? { profile } : {}) });
} finally {
  await cp.stop();
}

/**
 * One SVG document holding a histogram per round, stacked vertically (report.ts draws one series
 * per chart). Every <svg> gets a <title>: screen readers announce it, and biome requires one.
 */
function stackedHistograms(rounds: { conc: number; lat: number[] }[], floor: number): string {
  const H = 320;
  const titled = (doc: string, title: string, y: number) => {
    const open = doc.indexOf(">") + 1;
    return `${doc.slice(0, open).replace("<svg ", `<svg y="${y}" `)}\n<title>${title}</title>${doc.slice(open)}`;
  };
  const parts = rounds
    .filter((r) => r.lat.length > 0)
    .map((r, i) => {
      const title = `CreateVolume latency at concurrency ${r.conc} (${r.lat.length} calls; floor ${fmt(floor)} ms)`;
      return titled(svgHistogram({ title, unit: "ms", values: r.lat, bins: 30, height: H }), title, i * H);
    });
  return [
    `<svg xmlns="http://www.w3.org/2000/svg" width="720" height="${parts.length * H}" viewBox="0 0 720 ${parts.length * H}">`,
    `<title>CreateVolume latency distributions (floor ${fmt(floor)} ms)</title>`,
    ...parts,
    "</svg>",
    "",
  ].join("\n");
}
