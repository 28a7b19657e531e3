// The chaos run's fault schedule as a pure function of a seed: per fault, which process or node is
// hit, how long it stays down and how long the run waits before the next fault. Kept free of I/O so
// that a failing seed replays exactly and the schedule is unit-tested.
import { seededRandom } from "../../lib/seeded-random.ts";

/**
 * What a fault does to its storage node: kill -9 of the agent process, kill -9 of the nvmf_tgt
 * emulator process (its drive files stay), or both at once (the node dies).
 */
export const NODE_ACTIONS = ["agent", "target", "node"] as const;
export type NodeAction = (typeof NODE_ACTIONS)[number];

/**
 * What a fault hits: a storage node's process (or the whole node), the manager, or a drain of a
 * storage node (spec.drain set for downMs while the next faults go on, then cleared).
 */
export type FaultTarget =
  | { kind: "node"; index: number; action: NodeAction }
  | { kind: "manager" }
  | { kind: "drain"; index: number };

export interface Fault {
  /** 1-based. */
  n: number;
  target: FaultTarget;
  /** How long the killed processes stay down before they are started again. */
  downMs: number;
  /** Pause after the restart before the next fault (the next one may land during recovery). */
  gapMs: number;
}

export interface PlanOptions {
  seed: number;
  faults: number;
  /** Storage nodes (at least 2). */
  nodes: number;
  /**
   * Down time bounds of a node death. Above the volumes' failover bound the manager fails the
   * volume over; below it the serving node comes back first.
   */
  nodeDownMs?: readonly [number, number];
  /** Down time bounds of one process (agent, target, manager). */
  processDownMs?: readonly [number, number];
  /** Bounds of the pause before the next fault. */
  gapMs?: readonly [number, number];
  /**
   * Weight of drains among the faults (0, the default: none, and every seed's plan is the one it
   * had before drains existed; 1: as often as the manager is killed).
   */
  drainWeight?: number;
  /** How long a drain stays asked for (it may finish sooner), while the next faults go on. */
  drainMs?: readonly [number, number];
}

export const DEFAULT_NODE_DOWN_MS = [2000, 12000] as const;
export const DEFAULT_PROCESS_DOWN_MS = [200, 4000] as const;
export const DEFAULT_GAP_MS = [300, 3000] as const;
export const DEFAULT_DRAIN_MS = [20000, 60000] as const;

/**
 * Weights of the targets: node deaths most (they drive failovers and rebuilds), then single
 * processes, the manager least (one manager for the whole run).
 */
const WEIGHTS: readonly [FaultTarget["kind"] | NodeAction, number][] = [
  ["node", 4],
  ["target", 3],
  ["agent", 3],
  ["manager", 1],
];

function between(random: () => number, [lo, hi]: readonly [number, number]): number {
  return Math.round(lo + random() * (hi - lo));
}

/**
 * The schedule for `o.seed`: `o.faults` faults, one at a time (each restored before the next
 * starts). Same options, same plan. Throws on a non-integer seed, fewer than 2 nodes, a negative
 * fault count or inverted bounds.
 */
export function faultPlan(o: PlanOptions): Fault[] {
  if (!Number.isSafeInteger(o.seed) || o.seed < 0)
    throw new Error(`seed must be a non-negative integer, got ${o.seed}`);
  if (!Number.isSafeInteger(o.faults) || o.faults < 0)
    throw new Error(`faults must be a non-negative integer, got ${o.faults}`);
  if (!Number.isSafeInteger(o.nodes) || o.nodes < 2)
    throw new Error(`nodes must be at least 2, got ${o.nodes}`);
  const drainWeight = o.drainWeight ?? 0;
  if (!(Number.isFinite(drainWeight) && drainWeight >= 0))
    throw new Error(`drainWeight must be a number >= 0, got ${o.drainWeight}`);
  const drainMs = o.drainMs ?? DEFAULT_DRAIN_MS;
  const nodeDown = o.nodeDownMs ?? DEFAULT_NODE_DOWN_MS;
  const processDown = o.processDownMs ?? DEFAULT_PROCESS_DOWN_MS;
  const gap = o.gapMs ?? DEFAULT_GAP_MS;
  for (const [name, b] of [
    ["nodeDownMs", nodeDown],
    ["processDownMs", processDown],
    ["gapMs", gap],
    ["drainMs", drainMs],
  ] as const)
    if (!(b[0] >= 0 && b[1] >= b[0]))
      throw new Error(`${name} must be [lo, hi] with 0 <= lo <= hi, got [${b}]`);
  const random = seededRandom(o.seed);
  // Drains come last, so that with weight 0 every draw is what it was without them.
  const weights: readonly [FaultTarget["kind"] | NodeAction, number][] =
    drainWeight > 0 ? [...WEIGHTS, ["drain", drainWeight]] : WEIGHTS;
  const total = weights.reduce((s, [, w]) => s + w, 0);
  const out: Fault[] = [];
  for (let n = 1; n <= o.faults; n++) {
    let r = random() * total;
    let kind: FaultTarget["kind"] | NodeAction = "node";
    for (const [k, w] of weights) {
      if (r < w) {
        kind = k;
        break;
      }
      r -= w;
    }
    const index = Math.min(o.nodes - 1, Math.floor(random() * o.nodes));
    const target: FaultTarget =
      kind === "manager"
        ? { kind: "manager" }
        : kind === "drain"
          ? { kind: "drain", index }
          : { kind: "node", index, action: kind };
    const downMs = between(random, kind === "node" ? nodeDown : kind === "drain" ? drainMs : processDown);
    out.push({ n, target, downMs, gapMs: between(random, gap) });
  }
  return out;
}

/** One line per fault, for the run's log. */
export function describeFault(f: Fault, nodeNames: readonly string[]): string {
  if (f.target.kind === "drain")
    return `fault ${f.n}: drain of ${nodeNames[f.target.index]} for up to ${f.downMs} ms (the next faults go on), then ${f.gapMs} ms`;
  const what =
    f.target.kind === "manager"
      ? "kill -9 manager"
      : f.target.action === "node"
        ? `node death of ${nodeNames[f.target.index]} (kill -9 agent + nvmf_tgt)`
        : `kill -9 ${f.target.action === "agent" ? "agent" : "nvmf_tgt"} of ${nodeNames[f.target.index]}`;
  return `fault ${f.n}: ${what}, down ${f.downMs} ms, then ${f.gapMs} ms`;
}
