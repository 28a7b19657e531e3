// What the CSI node plugin can observe about its NVMe-oF connections, for /metrics: connect calls
// by result (counted around the initiator), and, from a periodic listing of the host's subsystems,
// paths per kernel controller state, subsystems without a live path, and reconnects (a path seen
// not live and then live again, which is the kernel's own reconnect completing).
import type { Clock } from "../../lib/clock.ts";
import { errorMessage } from "../../lib/errors.ts";
import type { Logger } from "../../lib/log.ts";
import type { Counter, Registry, SnapshotFamily } from "../../lib/metrics.ts";
import type { NvmeInitiator } from "../host/nvme-initiator.ts";

/**
 * The node plugin's connection families. Labels are bounded by construction: a connect result
 * (ok, error) and a kernel controller state (live, connecting, resetting, deleting, dead, new);
 * per-volume detail stays in NodeGetVolumeHealth, so a node with many volumes adds no series.
 */
export interface CsiNodeMetrics {
  connects: Counter<"result">;
  reconnects: Counter<never>;
  paths: SnapshotFamily<"state">;
  unreachable: SnapshotFamily<never>;
}

/** Registers the node plugin's connection families (reuse: safe to call more than once). */
export function csiNodeMetrics(registry: Registry): CsiNodeMetrics {
  return {
    connects: registry.counter({
      name: "distort_csi_node_connects_total",
      help: "NVMe-oF connect calls of NodeStage, one per portal, by result (ok, error).",
      labelNames: ["result"],
      reuse: true,
    }),
    reconnects: registry.counter({
      name: "distort_csi_node_reconnects_total",
      help: "Controllers seen in a state other than live and then live again (the kernel reconnected them).",
      reuse: true,
    }),
    paths: registry.snapshot({
      kind: "gauge",
      name: "distort_csi_node_paths",
      help: "NVMe-oF controllers (paths) of this host by kernel state, as last listed.",
      labelNames: ["state"],
      reuse: true,
    }),
    unreachable: registry.snapshot({
      kind: "gauge",
      name: "distort_csi_node_subsystems_without_live_path",
      help: "Connected fabric subsystems none of whose controllers is live, as last listed.",
      reuse: true,
    }),
  };
}

/** `initiator` with every connect counted by result; the other methods pass through. */
export function meteredInitiator(initiator: NvmeInitiator, m: CsiNodeMetrics): NvmeInitiator {
  return {
    connect: async (params) => {
      try {
        await initiator.connect(params);
        m.connects.inc({ result: "ok" });
      } catch (err) {
        m.connects.inc({ result: "error" });
        throw err;
      }
    },
    disconnect: (nqn) => initiator.disconnect(nqn),
    list: () => initiator.list(),
    findNamespaceDevice: (nqn, id) => initiator.findNamespaceDevice(nqn, id),
    rescan: (nqn) => initiator.rescan(nqn),
  };
}

/** Lists the host's subsystems and updates the path families; `observe` is one pass. */
export class PathObserver {
  readonly #initiator: NvmeInitiator;
  readonly #m: CsiNodeMetrics;
  readonly #log: Logger;
  /** Controllers (by subsystem and name) last seen in a state other than live. */
  #down = new Set<string>();

  constructor(initiator: NvmeInitiator, m: CsiNodeMetrics, log: Logger) {
    this.#initiator = initiator;
    this.#m = m;
    this.#log = log;
  }

  /** One listing. Local (pcie) controllers are not counted. Never throws; a failure is logged. */
  async observe(): Promise<void> {
    let subsystems: Awaited<ReturnType<NvmeInitiator["list"]>>;
    try {
      subsystems = await this.#initiator.list();
    } catch (err) {
      this.#log.warn("listing NVMe subsystems for metrics failed", { error: errorMessage(err) });
      return;
    }
    const byState = new Map<string, number>();
    const down = new Set<string>();
    let unreachable = 0;
    for (const s of subsystems) {
      const paths = s.paths.filter((p) => p.transport !== "pcie");
      if (paths.length === 0) continue;
      if (!paths.some((p) => p.state === "live")) unreachable++;
      for (const p of paths) {
        byState.set(p.state, (byState.get(p.state) ?? 0) + 1);
        const key = `${s.nqn}|${p.name}`;
        if (p.state !== "live") down.add(key);
        else if (this.#down.has(key)) this.#m.reconnects.inc();
      }
    }
    this.#down = down;
    this.#m.paths.replace([...byState].map(([state, n]) => [{ state }, n]));
    this.#m.unreachable.replace([[{}, unreachable]]);
  }

  /** Observes every `periodMs` until `signal` aborts. */
  async run(periodMs: number, clock: Clock, signal: AbortSignal): Promise<void> {
    while (!signal.aborted) {
      await this.observe();
      await clock.sleep(periodMs, signal).catch(() => {});
    }
  }
}
