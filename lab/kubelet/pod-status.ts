// The Pods the kubelet stand-in reads (a loose schema over the fields it uses, for the watch
// cache), the workload a Pod's container asks for, and the status the stand-in writes: phase,
// conditions and the workload container's state, in the shape kubelet posts. Pure.
import * as v from "valibot";
import type { KubeObject } from "../../lib/kube/resource.ts";
import { parseWorkloadArgs, type WorkloadArgs } from "../workload.ts";

/** A Pod volume; only persistentVolumeClaim ones concern the stand-in. */
export interface PodVolume {
  name: string;
  persistentVolumeClaim?: { claimName: string; readOnly?: boolean };
  [k: string]: unknown;
}

/** The container fields the stand-in reads. */
export interface PodContainer {
  name: string;
  image?: string;
  command?: string[];
  args?: string[];
  volumeMounts?: { name: string; mountPath: string; readOnly?: boolean }[];
  volumeDevices?: { name: string; devicePath: string }[];
  [k: string]: unknown;
}

/** A Pod condition as stored. */
export interface PodCondition {
  type: string;
  status: string;
  reason?: string;
  message?: string;
  lastTransitionTime?: string;
  [k: string]: unknown;
}

/** A Pod as the watch cache holds it (read-only for its users). */
export interface PodObject extends KubeObject {
  spec: {
    nodeName?: string;
    restartPolicy?: string;
    terminationGracePeriodSeconds?: number;
    volumes?: PodVolume[];
    containers: PodContainer[];
    initContainers?: PodContainer[];
    [k: string]: unknown;
  };
  status?: {
    phase?: string;
    conditions?: PodCondition[];
    startTime?: string;
    message?: string;
    [k: string]: unknown;
  };
}

const Str = v.string();
const Container = v.looseObject({
  name: Str,
  image: v.optional(Str),
  command: v.optional(v.array(Str)),
  args: v.optional(v.array(Str)),
  volumeMounts: v.optional(
    v.array(v.looseObject({ name: Str, mountPath: Str, readOnly: v.optional(v.boolean()) })),
  ),
  volumeDevices: v.optional(v.array(v.looseObject({ name: Str, devicePath: Str }))),
});

/** Pods as the watch delivers them; list items carry no apiVersion/kind, so both default. */
export const PodSchema = v.looseObject({
  apiVersion: v.optional(Str, "v1"),
  kind: v.optional(Str, "Pod"),
  metadata: v.looseObject({
    name: Str,
    namespace: v.optional(Str),
    uid: v.optional(Str),
    resourceVersion: v.optional(Str),
    deletionTimestamp: v.optional(Str),
    labels: v.optional(v.record(Str, Str)),
    annotations: v.optional(v.record(Str, Str)),
  }),
  spec: v.looseObject({
    nodeName: v.optional(Str),
    restartPolicy: v.optional(Str),
    terminationGracePeriodSeconds: v.optional(v.number()),
    volumes: v.optional(
      v.array(
        v.looseObject({
          name: Str,
          persistentVolumeClaim: v.optional(
            v.looseObject({ claimName: Str, readOnly: v.optional(v.boolean()) }),
          ),
        }),
      ),
    ),
    containers: v.array(Container),
    initContainers: v.optional(v.array(Container)),
  }),
  status: v.optional(
    v.looseObject({
      phase: v.optional(Str),
      conditions: v.optional(
        v.array(
          v.looseObject({
            type: Str,
            status: Str,
            reason: v.optional(Str),
            message: v.optional(Str),
            lastTransitionTime: v.optional(v.nullable(Str)),
          }),
        ),
      ),
      startTime: v.optional(Str),
      message: v.optional(Str),
    }),
  ),
}) as unknown as v.GenericSchema<unknown, PodObject>;

/** status.phase values the stand-in writes. */
export type PodPhase = "Pending" | "Running" | "Succeeded" | "Failed";

/** The workload container's state, as a containerStatuses[].state entry describes it. */
export type ContainerState =
  | { kind: "waiting"; reason: string; message?: string }
  | { kind: "running"; startedAt: string }
  | {
      kind: "terminated";
      exitCode: number;
      reason: string;
      message: string;
      startedAt: string;
      finishedAt: string;
      signal?: number;
    };

/** What the stand-in knows of a Pod; podStatus() turns it into the status it posts. */
export interface PodView {
  phase: PodPhase;
  container: ContainerState;
  lastTerminated?: ContainerState & { kind: "terminated" };
  restartCount: number;
  /** Volumes are staged and published: the "sandbox" is ready. */
  volumesReady: boolean;
  /** Why the Pod is not running yet (waiting for a claim, an attachment, a mount...). */
  waitingMessage?: string;
  /** status.message: the workload's latest result line, or why the Pod failed. */
  message?: string;
  /** status.reason, for a Pod failed by the stand-in itself. */
  reason?: string;
  startTime: string;
  hostIP: string;
}

function stateJson(s: ContainerState): Record<string, unknown> {
  switch (s.kind) {
    case "waiting":
      return { waiting: { reason: s.reason, ...(s.message ? { message: s.message } : {}) } };
    case "running":
      return { running: { startedAt: s.startedAt } };
    case "terminated":
      return {
        terminated: {
          exitCode: s.exitCode,
          reason: s.reason,
          message: s.message,
          startedAt: s.startedAt,
          finishedAt: s.finishedAt,
          containerID: "",
          ...(s.signal !== undefined ? { signal: s.signal } : {}),
        },
      };
  }
}

/**
 * The status to post for `pod`: conditions keep their lastTransitionTime while unchanged;
 * the one container runs the workload. `nowIso` stamps transitions.
 */
export function podStatus(pod: PodObject, view: PodView, nowIso: string): Record<string, unknown> {
  const running = view.container.kind === "running";
  const before = new Map((pod.status?.conditions ?? []).map((c) => [c.type, c]));
  const cond = (type: string, ok: boolean, reason?: string, message?: string) => {
    const status = ok ? "True" : "False";
    const prev = before.get(type);
    return {
      type,
      status,
      lastProbeTime: null,
      lastTransitionTime:
        prev?.status === status && prev.lastTransitionTime ? prev.lastTransitionTime : nowIso,
      ...(reason ? { reason } : {}),
      ...(message ? { message } : {}),
    };
  };
  const terminal = view.phase === "Succeeded" || view.phase === "Failed";
  const notReady = terminal ? "PodCompleted" : "ContainersNotReady";
  const first = pod.spec.containers[0];
  const containerID = `distort-lab://${pod.metadata.uid ?? pod.metadata.name}/${view.restartCount}`;
  const containerStatuses = first
    ? [
        {
          name: first.name,
          image: first.image ?? "",
          imageID: "",
          ...(view.container.kind === "waiting" ? {} : { containerID }),
          ready: running,
          started: running,
          restartCount: view.restartCount,
          state: stateJson(view.container),
          lastState: view.lastTerminated ? stateJson(view.lastTerminated) : {},
        },
      ]
    : [];
  return {
    phase: view.phase,
    conditions: [
      cond(
        "PodReadyToStartContainers",
        view.volumesReady && !terminal,
        view.volumesReady || terminal ? undefined : "VolumesNotReady",
        view.volumesReady || terminal ? undefined : view.waitingMessage,
      ),
      cond("Initialized", true),
      cond("Ready", running, running ? undefined : notReady),
      cond("ContainersReady", running, running ? undefined : notReady),
      cond("PodScheduled", true),
    ],
    hostIP: view.hostIP,
    hostIPs: [{ ip: view.hostIP }],
    startTime: view.startTime,
    containerStatuses,
    message: view.message ?? null,
    reason: view.reason ?? null,
  };
}

/** The workload a Pod runs and the volume it works on. */
export interface WorkloadSpec {
  /** Parsed container args, without a target: the stand-in adds --dir/--device itself. */
  args: WorkloadArgs;
  /** The Pod volume the workload uses: its first volumeMount (a directory) or volumeDevice (a device). */
  volume?: { name: string; kind: "dir" | "device" };
}

/**
 * What the Pod's container asks the stand-in to run: its `args` (or `command`) in the workload
 * protocol (lab/workload.ts). Throws an Error whose message says why the Pod cannot run here:
 * more than one container, init containers, a malformed command, or a data mode without a volume.
 */
export function workloadOf(pod: PodObject): WorkloadSpec {
  if ((pod.spec.initContainers ?? []).length > 0)
    throw new Error("the lab kubelet does not run init containers");
  const [c, ...more] = pod.spec.containers;
  if (c === undefined || more.length > 0)
    throw new Error("the lab kubelet runs Pods with exactly one container (the workload)");
  const argv = c.args?.length ? c.args : (c.command ?? []);
  let args: WorkloadArgs;
  try {
    args = parseWorkloadArgs(argv, { requireTarget: false });
  } catch (err) {
    throw new Error(`container ${c.name}: ${(err as Error).message}`);
  }
  if (args.target !== undefined)
    throw new Error(
      `container ${c.name}: --dir/--device come from the container's volumeMounts, not its args`,
    );
  if (args.mode === "hold") return { args };
  const mount = c.volumeMounts?.[0];
  const device = c.volumeDevices?.[0];
  if (mount) return { args, volume: { name: mount.name, kind: "dir" } };
  if (device) return { args, volume: { name: device.name, kind: "device" } };
  throw new Error(
    `container ${c.name}: ${args.mode} needs a volumeMount or volumeDevice of a PersistentVolumeClaim volume`,
  );
}
