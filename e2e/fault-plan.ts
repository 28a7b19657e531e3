// The fault suite's schedule as a pure function of a seed: per round, which phase of a volume's life
// is hit, which component is killed, and when (a delay after the phase starts, or an observed step).
// Kept free of I/O so that a failing seed can be replayed exactly and the schedule unit-tested.
import { seededRandom, shuffled } from "../lib/seeded-random.ts";

export const PHASES = ["create", "attach", "detach", "delete"] as const;
export type Phase = (typeof PHASES)[number];

/**
 * What a round kills: a DISTORT process (on the cluster, a Pod's container), or "node": kill -9 of
 * the writer's node (its kubelet and container runtime; its Pods' containers keep running), which
 * is then brought back.
 */
export const COMPONENTS = ["manager", "agent", "csi-controller", "nvmf_tgt", "node"] as const;
export type Component = (typeof COMPONENTS)[number];

/**
 * Observable points inside each phase. Each is a state that stays true once reached (until the
 * phase's own end state makes it moot), so a watcher that starts late still sees it.
 */
export const STEPS = {
  create: ["partition-created", "partition-placed", "partition-exported"],
  attach: ["volumeattachment-created", "nvmeva-created", "node-staged"],
  detach: ["pod-deletion-requested", "volumeattachment-deleting"],
  delete: ["pvc-deletion-requested", "partition-deleting"],
} as const satisfies Record<Phase, readonly string[]>;
export type Step = (typeof STEPS)[Phase][number];

export const STEP_TEXT: Record<Step, string> = {
  "partition-created": "the NVMePartition appears",
  "partition-placed": "the NVMePartition is Placed",
  "partition-exported": "the NVMePartition is Exported",
  "volumeattachment-created": "the VolumeAttachment is created",
  "nvmeva-created": "the NVMeVolumeAttachment is created",
  "node-staged": "NodeStage mounted the volume",
  "pod-deletion-requested": "the Pod deletion request",
  "volumeattachment-deleting": "the VolumeAttachment deletion starts",
  "pvc-deletion-requested": "the PVC deletion request",
  "partition-deleting": "the NVMePartition deletion starts",
};

export type Trigger = { kind: "delay"; ms: number } | { kind: "step"; step: Step };

export const STORAGE_CLASSES = ["distort-lab", "distort-lab-immediate"] as const;
export type StorageClassName = (typeof STORAGE_CLASSES)[number];

/**
 * Largest planned delay after a phase starts. Delays are drawn skewed towards zero (the cube of a
 * uniform draw): in the lab most phases finish within a few hundred milliseconds, so a uniform
 * delay would mostly land after the work it is meant to interrupt, while the tail still reaches
 * into the slow phases of a loaded machine.
 */
export const MAX_DELAY_MS = 1500;

export interface RoundPlan {
  /** 1-based. */
  round: number;
  phase: Phase;
  component: Component;
  trigger: Trigger;
  storageClass: StorageClassName;
  /**
   * Storage node (index) whose agent or nvmf_tgt is killed when the volume is not placed yet at
   * the kill; once placed, the volume's own node is hit, since that is where the work is.
   */
  fallbackStorageNode: number;
  /** The writer keeps running after its result (`--then-hold`) instead of exiting. */
  writerHolds: boolean;
  /** Pattern length: whole 4 KiB blocks. */
  bytes: number;
  /** The workload's --seed: the pattern's identity. */
  dataSeed: string;
}

/** Rounds per block: every component once, every phase at least once. */
export const BLOCK_ROUNDS = COMPONENTS.length;

function pick<T>(rng: () => number, xs: readonly T[]): T {
  const x = xs[Math.floor(rng() * xs.length)];
  if (x === undefined) throw new Error("pick from an empty list");
  return x;
}

/**
 * The plan for `rounds` rounds. Rounds come in blocks of BLOCK_ROUNDS (one per component), each
 * block a shuffle of the phases plus one more phase drawn at random, paired with an independent
 * shuffle of the components, so any block-aligned BLOCK_ROUNDS rounds hit every phase and every
 * component however the seed falls. Every value is drawn in a fixed order per block, so the plan
 * for n rounds is a prefix of the plan for more.
 */
export function faultPlan(seed: number, rounds: number, storageNodes = 2): RoundPlan[] {
  if (!Number.isInteger(rounds) || rounds < 0)
    throw new Error(`rounds must be a whole number, got ${rounds}`);
  if (!Number.isInteger(storageNodes) || storageNodes < 1) throw new Error("at least one storage node");
  const rng = seededRandom(seed);
  const plan: RoundPlan[] = [];
  while (plan.length < rounds) {
    const phases = [...shuffled(PHASES, rng), pick(rng, PHASES)];
    const components = shuffled(COMPONENTS, rng);
    for (let i = 0; i < BLOCK_ROUNDS; i++) {
      const phase = phases[i] as Phase;
      const component = components[i] as Component;
      const byStep = rng() < 0.5;
      const trigger: Trigger = byStep
        ? { kind: "step", step: pick<Step>(rng, STEPS[phase]) }
        : { kind: "delay", ms: Math.floor(rng() ** 3 * (MAX_DELAY_MS + 1)) };
      const round = plan.length + 1;
      plan.push({
        round,
        phase,
        component,
        trigger,
        storageClass: pick(rng, STORAGE_CLASSES),
        fallbackStorageNode: Math.floor(rng() * storageNodes),
        writerHolds: rng() < 0.5,
        bytes: (256 + Math.floor(rng() * 1793)) * 4096,
        dataSeed: `fault-${seed}-${round}`,
      });
    }
  }
  return plan.slice(0, rounds);
}

/** The seed from DISTORT_FAULT_SEED (a uint32), or a fresh one from `random` when unset. */
export function parseSeed(text: string | undefined, random: () => number = Math.random): number {
  if (text === undefined || text.trim() === "") return Math.floor(random() * 2 ** 32) >>> 0;
  const t = text.trim();
  if (!/^\d+$/.test(t) || Number(t) >= 2 ** 32)
    throw new Error(`DISTORT_FAULT_SEED must be 0..4294967295, got ${JSON.stringify(text)}`);
  return Number(t);
}

/** The round count from DISTORT_FAULT_ROUNDS (1..100), `fallback` when unset. */
export function parseRounds(text: string | undefined, fallback = 8): number {
  if (text === undefined || text.trim() === "") return fallback;
  const t = text.trim();
  const n = Number(t);
  if (!/^\d+$/.test(t) || n < 1 || n > 100)
    throw new Error(`DISTORT_FAULT_ROUNDS must be 1..100, got ${JSON.stringify(text)}`);
  return n;
}

/** The trigger in words: "+734 ms after the phase starts" or "after the NVMePartition is Placed". */
export function describeTrigger(t: Trigger): string {
  return t.kind === "delay" ? `${t.ms} ms after the phase starts` : `after ${STEP_TEXT[t.step]}`;
}

/** One line per round, for the log and for a failure's diagnosis. */
export function describeRound(p: RoundPlan): string {
  const mib = (p.bytes / 2 ** 20).toFixed(2);
  return (
    `round ${p.round}: kill ${p.component} during ${p.phase}, ${describeTrigger(p.trigger)}; ` +
    `class ${p.storageClass}, writer ${p.writerHolds ? "holds" : "exits"}, ${mib} MiB seed ${p.dataSeed}` +
    (p.component === "agent" || p.component === "nvmf_tgt"
      ? `, storage node #${p.fallbackStorageNode} if unplaced`
      : "")
  );
}

/** A kill that happened. */
export interface InjectedFault {
  round: number;
  phase: Phase;
  component: Component;
  /** The phase's work was still under way at the kill (not already converged). */
  inProgress: boolean;
}

/** The summary lines: totals per component, then per phase. */
export function summarizeFaults(faults: readonly InjectedFault[]): string[] {
  const count = <K extends string>(keys: readonly K[], key: (f: InjectedFault) => K) =>
    keys.map((k) => `${k}: ${faults.filter((f) => key(f) === k).length}`).join(", ");
  return [
    `faults injected: ${faults.length} (${count(COMPONENTS, (f) => f.component)})`,
    `faults per phase: ${count(PHASES, (f) => f.phase)}`,
    `faults that hit a phase still in progress: ${faults.filter((f) => f.inProgress).length} of ${faults.length}`,
  ];
}
