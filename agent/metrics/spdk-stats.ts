// The storage node's SPDK statistics for /metrics: one bounded round of RPCs per period (I/O per
// volume, lvstore space and thin allocation, reactor and thread load, connected hosts), mirrored
// into snapshot families so a scrape only renders what the last round read.
import * as v from "valibot";
import { errorMessage } from "../../lib/errors.ts";
import type { Logger } from "../../lib/log.ts";
import type { Registry, SnapshotFamily } from "../../lib/metrics.ts";
import type { SpdkRpc } from "../../lib/spdk/client.ts";
import * as S from "../../lib/spdk/schemas.ts";

/**
 * A volume this node serves, as the agent's cache knows it. Series are labelled by the
 * NVMePartition's namespace and name: unique in the cluster, stable for the volume's life, and
 * bounded by the node's exports (issue 19: up to 2000), unlike bdev UUIDs or NQNs nobody reads.
 */
export interface ServedVolume {
  readonly namespace: string;
  readonly partition: string;
  /** NVMePartition status.state. */
  readonly state: string;
  /** status.backendPath: the lvol bdev's name (its UUID). */
  readonly bdev: string | undefined;
  /** status.nqn: the exporting subsystem. */
  readonly nqn: string | undefined;
}

type VolumeLabel = "namespace" | "partition";

/** The families this collector fills; `spdkStatsMetrics` registers them. */
export interface SpdkStatsMetrics {
  readOps: SnapshotFamily<VolumeLabel>;
  writeOps: SnapshotFamily<VolumeLabel>;
  readBytes: SnapshotFamily<VolumeLabel>;
  writeBytes: SnapshotFamily<VolumeLabel>;
  readSeconds: SnapshotFamily<VolumeLabel>;
  writeSeconds: SnapshotFamily<VolumeLabel>;
  connectedHosts: SnapshotFamily<VolumeLabel>;
  served: SnapshotFamily<VolumeLabel>;
  failed: SnapshotFamily<VolumeLabel>;
  lvstoreTotal: SnapshotFamily<"lvstore" | "base_bdev">;
  lvstoreFree: SnapshotFamily<"lvstore" | "base_bdev">;
  lvstoreProvisioned: SnapshotFamily<"lvstore" | "base_bdev">;
  lvstoreThinAllocated: SnapshotFamily<"lvstore" | "base_bdev">;
  reactorBusy: SnapshotFamily<"lcore">;
  reactorIdle: SnapshotFamily<"lcore">;
  threadBusy: SnapshotFamily<"thread">;
  threadIdle: SnapshotFamily<"thread">;
  rounds: SnapshotFamily<"result">;
  roundSeconds: SnapshotFamily<never>;
  lastSuccess: SnapshotFamily<never>;
}

/** Registers the SPDK statistics families on `registry` (reuse: safe to call more than once). */
export function spdkStatsMetrics(registry: Registry): SpdkStatsMetrics {
  const vol = ["namespace", "partition"] as const;
  const lvs = ["lvstore", "base_bdev"] as const;
  const counter = <L extends string>(name: string, help: string, labelNames: readonly L[]) =>
    registry.snapshot<L>({ kind: "counter", name, help, labelNames, reuse: true });
  const gauge = <L extends string>(name: string, help: string, labelNames: readonly L[]) =>
    registry.snapshot<L>({ kind: "gauge", name, help, labelNames, reuse: true });
  return {
    readOps: counter(
      "distort_volume_read_ops_total",
      "Reads completed by the volume's bdev (SPDK bdev_get_iostat).",
      vol,
    ),
    writeOps: counter("distort_volume_write_ops_total", "Writes completed by the volume's bdev.", vol),
    readBytes: counter("distort_volume_read_bytes_total", "Bytes read from the volume's bdev.", vol),
    writeBytes: counter("distort_volume_written_bytes_total", "Bytes written to the volume's bdev.", vol),
    readSeconds: counter(
      "distort_volume_read_seconds_total",
      "Summed latency of completed reads; divided by the read ops' rate it is the mean read latency.",
      vol,
    ),
    writeSeconds: counter(
      "distort_volume_write_seconds_total",
      "Summed latency of completed writes; divided by the write ops' rate it is the mean write latency.",
      vol,
    ),
    connectedHosts: gauge(
      "distort_volume_connected_hosts",
      "Distinct host NQNs with a controller on the volume's subsystem (nvmf_subsystem_get_controllers).",
      vol,
    ),
    served: gauge(
      "distort_volume_served",
      "For an Exported partition: 1 while the target serves its subsystem with the volume's namespace, 0 when not.",
      vol,
    ),
    failed: gauge("distort_volume_failed", "1 for a partition of this node in state Failed.", vol),
    lvstoreTotal: gauge(
      "distort_lvstore_total_bytes",
      "Data capacity of the lvstore (total data clusters).",
      lvs,
    ),
    lvstoreFree: gauge("distort_lvstore_free_bytes", "Unallocated clusters of the lvstore, in bytes.", lvs),
    lvstoreProvisioned: gauge(
      "distort_lvstore_provisioned_bytes",
      "Summed size of the lvstore's lvols as their users see it (thin lvols at their full size).",
      lvs,
    ),
    lvstoreThinAllocated: gauge(
      "distort_lvstore_thin_allocated_bytes",
      "Clusters thin lvols of the lvstore have allocated so far, in bytes.",
      lvs,
    ),
    reactorBusy: counter("distort_spdk_reactor_busy_seconds_total", "Time the reactor spent on work.", [
      "lcore",
    ]),
    reactorIdle: counter("distort_spdk_reactor_idle_seconds_total", "Time the reactor polled without work.", [
      "lcore",
    ]),
    threadBusy: counter("distort_spdk_thread_busy_seconds_total", "Time the SPDK thread spent on work.", [
      "thread",
    ]),
    threadIdle: counter("distort_spdk_thread_idle_seconds_total", "Time the SPDK thread polled idle.", [
      "thread",
    ]),
    rounds: counter("distort_spdk_stats_rounds_total", "Statistics rounds by result (ok, error).", [
      "result",
    ]),
    roundSeconds: gauge("distort_spdk_stats_round_seconds", "Duration of the last statistics round.", []),
    lastSuccess: gauge(
      "distort_spdk_stats_last_success_timestamp_seconds",
      "Unix time of the last complete statistics round.",
      [],
    ),
  };
}

export interface SpdkStatsOptions {
  rpc: SpdkRpc;
  metrics: SpdkStatsMetrics;
  /** The partitions of this node (from the agent's cache); read once per round. */
  volumes: () => readonly ServedVolume[];
  logger: Logger;
  /** Milliseconds since the epoch. */
  now: () => number;
  /**
   * nvmf_subsystem_get_controllers calls per round (it takes one subsystem per call). With more
   * volumes than this, a round asks the next slice in turn and the others keep their last count,
   * so the target's RPC thread sees a bounded burst whatever the node holds. Default 200.
   */
  maxControllerQueries?: number;
  /** How many of those calls are in flight at once on the shared connection. Default 8. */
  concurrency?: number;
  /**
   * Called after each good round with its lvstores and bdevs (agent/space/space-report.ts), so
   * space is watched without a second listing; awaited, and a rejection only logged.
   */
  onSpace?: (lvstores: readonly S.Lvstore[], bdevs: readonly S.Bdev[]) => Promise<void>;
}

function parse<T extends v.GenericSchema>(schema: T, method: string, value: unknown): v.InferOutput<T> {
  const r = v.safeParse(schema, value);
  if (!r.success) throw new Error(`${method}: unexpected reply (${v.summarize(r.issues)})`);
  return r.output;
}

/** Runs statistics rounds (node-metrics.ts repeats them every period). */
export class SpdkStatsCollector {
  readonly #o: SpdkStatsOptions;
  readonly #hosts = new Map<string, number>();
  #cursor = 0;
  #ok = 0;
  #errors = 0;

  constructor(o: SpdkStatsOptions) {
    this.#o = o;
  }

  /**
   * One round: six listing RPCs (bdev_get_iostat, bdev_get_bdevs, bdev_lvol_get_lvstores,
   * nvmf_get_subsystems, framework_get_reactors, thread_get_stats) issued together, then at most
   * maxControllerQueries nvmf_subsystem_get_controllers. Never throws: a failed round is counted
   * and logged, and the families keep what the last good round read.
   */
  async round(): Promise<void> {
    const o = this.#o;
    const t0 = o.now();
    try {
      const [iostat, bdevs, lvstores, subsystems, reactors, threads] = await Promise.all([
        o.rpc.call("bdev_get_iostat").then((r) => parse(S.IostatSchema, "bdev_get_iostat", r)),
        o.rpc.call("bdev_get_bdevs").then((r) => parse(S.BdevListSchema, "bdev_get_bdevs", r)),
        o.rpc
          .call("bdev_lvol_get_lvstores")
          .then((r) => parse(S.LvstoreListSchema, "bdev_lvol_get_lvstores", r)),
        o.rpc
          .call("nvmf_get_subsystems")
          .then((r) => parse(S.NvmfSubsystemListSchema, "nvmf_get_subsystems", r)),
        o.rpc
          .call("framework_get_reactors")
          .then((r) => parse(S.ReactorsSchema, "framework_get_reactors", r)),
        o.rpc.call("thread_get_stats").then((r) => parse(S.ThreadStatsSchema, "thread_get_stats", r)),
      ]);
      const volumes = o.volumes();
      await this.#queryHosts(volumes, subsystems);
      this.#publish(volumes, iostat, bdevs, lvstores, subsystems, reactors, threads);
      await o
        .onSpace?.(lvstores, bdevs)
        .catch((err: unknown) => o.logger.warn("space report failed", { error: errorMessage(err) }));
      this.#ok++;
      o.metrics.lastSuccess.replace([[{}, o.now() / 1000]]);
    } catch (err) {
      this.#errors++;
      o.logger.warn("SPDK statistics round failed", { error: errorMessage(err) });
    } finally {
      o.metrics.rounds.replace([
        [{ result: "ok" }, this.#ok],
        [{ result: "error" }, this.#errors],
      ]);
      o.metrics.roundSeconds.replace([[{}, (o.now() - t0) / 1000]]);
    }
  }

  /** Connected hosts of the next slice of exported subsystems; the rest keep their last count. */
  async #queryHosts(volumes: readonly ServedVolume[], subsystems: readonly S.NvmfSubsystem[]): Promise<void> {
    const o = this.#o;
    const present = new Set(subsystems.map((s) => s.nqn));
    const nqns = volumes
      .map((vol) => vol.nqn)
      .filter((n): n is string => n !== undefined && present.has(n))
      .sort();
    for (const n of [...this.#hosts.keys()]) if (!present.has(n)) this.#hosts.delete(n);
    if (nqns.length === 0) return;
    const budget = Math.min(nqns.length, o.maxControllerQueries ?? 200);
    const start = this.#cursor % nqns.length;
    const slice = Array.from({ length: budget }, (_, i) => nqns[(start + i) % nqns.length] as string);
    this.#cursor = (start + budget) % nqns.length;
    let next = 0;
    const worker = async () => {
      while (next < slice.length) {
        const nqn = slice[next++] as string;
        try {
          const ctrls = parse(
            S.NvmfControllerListSchema,
            "nvmf_subsystem_get_controllers",
            await o.rpc.call("nvmf_subsystem_get_controllers", { nqn }),
          );
          this.#hosts.set(nqn, new Set(ctrls.map((c) => c.hostnqn)).size);
        } catch (err) {
          // Deleted between the listing and this call (-32602): it drops out next round.
          this.#hosts.delete(nqn);
          o.logger.debug("nvmf_subsystem_get_controllers failed", { nqn, error: errorMessage(err) });
        }
      }
    };
    await Promise.all(Array.from({ length: Math.min(o.concurrency ?? 8, slice.length) }, worker));
  }

  #publish(
    volumes: readonly ServedVolume[],
    iostat: S.Iostat,
    bdevs: readonly S.Bdev[],
    lvstores: readonly S.Lvstore[],
    subsystems: readonly S.NvmfSubsystem[],
    reactors: S.Reactors,
    threads: S.ThreadStats,
  ): void {
    const m = this.#o.metrics;
    const stat = new Map(iostat.bdevs.map((b) => [b.name, b]));
    const served = new Map(
      subsystems.map((s) => [s.nqn, new Set((s.namespaces ?? []).map((n) => n.bdev_name))]),
    );
    type Row<L extends string> = [Record<L, string>, number];
    const io: Record<"ro" | "wo" | "rb" | "wb" | "rs" | "ws", Row<VolumeLabel>[]> = {
      ro: [],
      wo: [],
      rb: [],
      wb: [],
      rs: [],
      ws: [],
    };
    const hosts: Row<VolumeLabel>[] = [];
    const servedRows: Row<VolumeLabel>[] = [];
    const failedRows: Row<VolumeLabel>[] = [];
    const seen = new Set<string>();
    for (const vol of volumes) {
      const l = { namespace: vol.namespace, partition: vol.partition };
      const key = `${vol.namespace}/${vol.partition}`;
      if (seen.has(key)) continue;
      seen.add(key);
      failedRows.push([l, vol.state === "Failed" ? 1 : 0]);
      const s = vol.bdev === undefined ? undefined : stat.get(vol.bdev);
      if (s) {
        io.ro.push([l, s.num_read_ops]);
        io.wo.push([l, s.num_write_ops]);
        io.rb.push([l, s.bytes_read]);
        io.wb.push([l, s.bytes_written]);
        io.rs.push([l, s.read_latency_ticks / iostat.tick_rate]);
        io.ws.push([l, s.write_latency_ticks / iostat.tick_rate]);
      }
      if (vol.state === "Exported") {
        const ns = vol.nqn === undefined ? undefined : served.get(vol.nqn);
        servedRows.push([l, ns !== undefined && vol.bdev !== undefined && ns.has(vol.bdev) ? 1 : 0]);
      }
      const h = vol.nqn === undefined ? undefined : this.#hosts.get(vol.nqn);
      if (h !== undefined) hosts.push([l, h]);
    }
    m.readOps.replace(io.ro);
    m.writeOps.replace(io.wo);
    m.readBytes.replace(io.rb);
    m.writeBytes.replace(io.wb);
    m.readSeconds.replace(io.rs);
    m.writeSeconds.replace(io.ws);
    m.connectedHosts.replace(hosts);
    m.served.replace(servedRows);
    m.failed.replace(failedRows);

    // Thin allocation per lvstore: lvol bdevs name their lvstore by UUID.
    const perLvs = new Map<string, { provisioned: number; thin: number }>();
    const byUuid = new Map(lvstores.map((s) => [s.uuid, s]));
    for (const b of bdevs) {
      const lv = b.driver_specific?.lvol;
      const store = lv ? byUuid.get(lv.lvol_store_uuid) : undefined;
      if (!lv || !store || lv.snapshot) continue;
      const acc = perLvs.get(store.uuid) ?? { provisioned: 0, thin: 0 };
      acc.provisioned += b.num_blocks * b.block_size;
      if (lv.thin_provision) acc.thin += (lv.num_allocated_clusters ?? 0) * store.cluster_size;
      perLvs.set(store.uuid, acc);
    }
    const lvsLabels = (s: S.Lvstore) => ({ lvstore: s.name, base_bdev: s.base_bdev });
    m.lvstoreTotal.replace(lvstores.map((s) => [lvsLabels(s), s.total_data_clusters * s.cluster_size]));
    m.lvstoreFree.replace(lvstores.map((s) => [lvsLabels(s), s.free_clusters * s.cluster_size]));
    m.lvstoreProvisioned.replace(lvstores.map((s) => [lvsLabels(s), perLvs.get(s.uuid)?.provisioned ?? 0]));
    m.lvstoreThinAllocated.replace(lvstores.map((s) => [lvsLabels(s), perLvs.get(s.uuid)?.thin ?? 0]));

    const rate = reactors.tick_rate;
    m.reactorBusy.replace(reactors.reactors.map((r) => [{ lcore: String(r.lcore) }, (r.busy ?? 0) / rate]));
    m.reactorIdle.replace(reactors.reactors.map((r) => [{ lcore: String(r.lcore) }, (r.idle ?? 0) / rate]));
    // Thread names are unique in nvmf_tgt (app_thread, nvmf_tgt_poll_group_NNN): one per reactor.
    const tb = new Map<string, number>();
    const ti = new Map<string, number>();
    for (const t of threads.threads) {
      tb.set(t.name, (tb.get(t.name) ?? 0) + t.busy / threads.tick_rate);
      ti.set(t.name, (ti.get(t.name) ?? 0) + t.idle / threads.tick_rate);
    }
    m.threadBusy.replace([...tb].map(([thread, s]) => [{ thread }, s]));
    m.threadIdle.replace([...ti].map(([thread, s]) => [{ thread }, s]));
  }
}
