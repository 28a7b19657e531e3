// One Pod's life on the kubelet stand-in: resolve its claims to CSI PersistentVolumes, report
// them in use, wait for the attach-detach controller's attachment, stage and publish, run the
// workload, expand volumes online, and on termination or deletion tear everything down again.
import * as k8s from "@kubernetes/client-node";
import { errorMessage } from "../../lib/errors.ts";
import { kubeError } from "../../lib/kube/resource.ts";
import type { Logger } from "../../lib/log.ts";
import { formatWorkloadArgs } from "../workload.ts";
import {
  expansionFailedStatus,
  expansionFinishedStatus,
  expansionStartedStatus,
  patchClaimStatus,
  wantsNodeExpansion,
} from "./expansion.ts";
import { attachmentName, publishPath, stagingPath, uniqueVolumeName, type VolumeMode } from "./naming.ts";
import type { NodeAgent } from "./node-agent.ts";
import {
  type ContainerState,
  type PodObject,
  type PodPhase,
  podStatus,
  type WorkloadSpec,
  workloadOf,
} from "./pod-status.ts";
import type { VolumeCall, VolumeManager } from "./volume-manager.ts";
import { quantityBytes, volumeCapabilityOf, volumeModeOf } from "./volume-spec.ts";
import { type RunningWorkload, startWorkload, type WorkloadExit } from "./workload-runner.ts";

/**
 * Which volumes live Pods want on this node, so a volume shared by Pods is not unstaged under one
 * that is still setting up. In memory only: a restarted stand-in rebuilds it from its Pods.
 */
export class WantedVolumes {
  private readonly byHandle = new Map<string, Map<string, string>>();

  want(podUID: string, volumeHandle: string, uniqueName: string): void {
    const pods = this.byHandle.get(volumeHandle) ?? new Map<string, string>();
    pods.set(podUID, uniqueName);
    this.byHandle.set(volumeHandle, pods);
  }

  release(podUID: string): void {
    for (const [handle, pods] of this.byHandle) {
      pods.delete(podUID);
      if (pods.size === 0) this.byHandle.delete(handle);
    }
  }

  isWanted(volumeHandle: string): boolean {
    return (this.byHandle.get(volumeHandle)?.size ?? 0) > 0;
  }

  names(): string[] {
    return [...this.byHandle.values()].flatMap((pods) => [...pods.values()]);
  }
}

/** What every worker shares. */
export interface WorkerContext {
  nodeName: string;
  driver: string;
  rootDir: string;
  caps: { stageUnstage: boolean; expand: boolean };
  core: k8s.CoreV1Api;
  storage: k8s.StorageV1Api;
  volumes: VolumeManager;
  node: NodeAgent;
  wanted: WantedVolumes;
  logger: Logger;
  /** Poll period while waiting for a claim or an attachment. */
  pollMs: number;
  /** Period of re-checks of a running Pod (expansion). */
  resyncMs: number;
  /** SIGTERM-to-SIGKILL grace when a workload is stopped. */
  killGraceMs: number;
  /** The cached Pod `key` when it is still incarnation `uid`. */
  currentPod(key: string, uid: string): PodObject | undefined;
  stopping(): boolean;
  /** The worker is done (its Pod is gone and torn down). */
  finished(uid: string): void;
}

/** Not an error: something the Pod waits for; the message goes into its status, the sync retries. */
class NotYet extends Error {}
/** The Pod cannot run on this node; it is marked Failed with this message. */
class PodFailure extends Error {
  constructor(
    readonly reason: string,
    message: string,
  ) {
    super(message);
  }
}

/** One PVC volume of the Pod, resolved to its PersistentVolume. */
interface VolumePlan extends VolumeCall {
  podVolume: string;
  claimName: string;
  readOnly: boolean;
  publishPath: string;
}

const TERMINAL: ReadonlySet<string> = new Set(["Succeeded", "Failed"]);

function isoNow(): string {
  return `${new Date().toISOString().slice(0, 19)}Z`;
}

function notFound(err: unknown): boolean {
  return kubeError(err, "").kind === "not-found";
}

/**
 * Drives one Pod (by UID). Syncs are serialized: a kick while a sync runs schedules one more.
 * A sync that fails is retried with backoff; teardown is retried until it completes, so a Pod
 * whose object is gone still has its volumes unpublished and unstaged.
 */
export class PodWorker {
  private plans: VolumePlan[] = [];
  private ready = false;
  private workload: RunningWorkload | undefined;
  private spec: WorkloadSpec | undefined;
  private container: ContainerState = { kind: "waiting", reason: "ContainerCreating" };
  private lastTerminated: (ContainerState & { kind: "terminated" }) | undefined;
  private restartCount = 0;
  private restartAt = 0;
  private phase: PodPhase = "Pending";
  private message: string | undefined;
  private reason: string | undefined;
  private waiting: string | undefined;
  private startTime = isoNow();
  private adopted = false;
  private tornDown = false;
  private deleting = false;
  private lastWritten: string | undefined;
  private lastLogged: string | undefined;
  private failures = 0;
  private pod: PodObject | undefined;
  private timer: ReturnType<typeof setTimeout> | undefined;
  private due = 0;
  /** A finished Pod adopted from an earlier instance: its recorded status is left as it is. */
  private frozen = false;
  private inFlight: Promise<void> | undefined;
  private again = false;
  private done = false;
  private readonly log: Logger;

  constructor(
    private readonly ctx: WorkerContext,
    readonly uid: string,
    /** namespace/name; undefined for an orphan found on disk whose Pod no longer exists. */
    readonly key: string | undefined,
  ) {
    this.log = ctx.logger.with({ pod: key ?? `(gone) ${uid}` });
  }

  /** Schedules a sync after `delayMs`; an earlier scheduled sync is kept. */
  kick(delayMs = 0): void {
    if (this.done || this.ctx.stopping()) return;
    if (this.inFlight && delayMs === 0) {
      this.again = true;
      return;
    }
    const due = Date.now() + delayMs;
    if (this.timer && this.due <= due) return;
    if (this.timer) clearTimeout(this.timer);
    this.due = due;
    this.timer = setTimeout(() => {
      this.timer = undefined;
      this.runSync();
    }, delayMs);
  }

  private runSync(): void {
    if (this.done || this.ctx.stopping()) return;
    if (this.inFlight) {
      this.again = true;
      return;
    }
    this.inFlight = (async () => {
      let next: number | undefined;
      try {
        next = await this.sync();
        this.failures = 0;
      } catch (err) {
        this.failures++;
        next = Math.min(this.ctx.pollMs * 2 ** Math.min(this.failures, 6), 10_000);
        await this.onError(err).catch(() => {});
      } finally {
        this.inFlight = undefined;
      }
      if (this.again) {
        this.again = false;
        this.kick(0);
      } else if (next !== undefined) this.kick(next);
    })();
  }

  /**
   * The stand-in stops: no further sync starts and the workload is stopped (SIGTERM, then
   * SIGKILL) without anything recorded about it. A sync in flight may still be running; see idle().
   */
  async shutdown(): Promise<void> {
    this.done = true;
    if (this.timer) clearTimeout(this.timer);
    await this.workload?.stop(this.ctx.killGraceMs);
  }

  /** Resolves when no sync is in flight. */
  async idle(): Promise<void> {
    await this.inFlight;
  }

  /** One pass; returns when to sync again (undefined: only when kicked). */
  private async sync(): Promise<number | undefined> {
    const pod = this.key ? this.ctx.currentPod(this.key, this.uid) : undefined;
    if (pod === undefined || pod.metadata.deletionTimestamp) return this.syncDeleted(pod);
    this.pod = pod;
    if (!this.adopted) this.adopt(pod);
    if (TERMINAL.has(this.phase)) {
      await this.writeStatus(pod);
      if (!this.tornDown) await this.teardown();
      return undefined;
    }
    try {
      this.spec ??= workloadOf(pod);
    } catch (err) {
      return this.fail(pod, "UnsupportedPod", errorMessage(err));
    }
    if (!this.ready) {
      try {
        await this.setUp(pod);
      } catch (err) {
        if (err instanceof PodFailure) return this.fail(pod, err.reason, err.message);
        if (!(err instanceof NotYet)) throw err;
        this.waitFor(err.message);
        await this.writeStatus(pod);
        return this.ctx.pollMs;
      }
    }
    if (this.workload === undefined && this.container.kind !== "terminated") {
      const wait = this.restartAt - Date.now();
      if (wait > 0) {
        await this.writeStatus(pod);
        return wait;
      }
      this.start(pod);
    }
    await this.writeStatus(pod);
    await this.expandIfAsked(pod);
    return this.ctx.resyncMs;
  }

  /** Takes over what an earlier stand-in recorded: a finished Pod stays finished; restarts are counted. */
  private adopt(pod: PodObject): void {
    this.adopted = true;
    const st = pod.status;
    if (st?.startTime) this.startTime = st.startTime;
    const cs = (st?.containerStatuses as { restartCount?: number }[] | undefined)?.[0];
    if (st?.phase && TERMINAL.has(st.phase)) {
      this.phase = st.phase as PodPhase;
      this.frozen = true;
      return;
    }
    if (st?.phase === "Running") {
      // The container's process went with the previous instance: this run is a restart.
      this.restartCount = (cs?.restartCount ?? 0) + 1;
      this.log.info("pod was running under a previous kubelet; its workload starts again", {
        restartCount: this.restartCount,
      });
    }
  }

  private waitFor(message: string): void {
    this.waiting = message;
    this.message = message;
    if (message !== this.lastLogged) {
      this.lastLogged = message;
      this.log.info(message);
    }
  }

  /** A failed sync: logged once per distinct message; a Pod still setting up shows it in its status. */
  private async onError(err: unknown): Promise<void> {
    const msg = errorMessage(err);
    if (msg !== this.lastLogged) {
      this.lastLogged = msg;
      this.log.warn("pod sync failed; retrying", { err: msg, failures: this.failures });
    }
    if (!this.ready && !TERMINAL.has(this.phase) && !this.deleting && this.pod) {
      this.waiting = msg;
      this.message = msg;
      await this.writeStatus(this.pod);
    }
  }

  private async fail(pod: PodObject, reason: string, message: string): Promise<number> {
    this.log.warn(`pod cannot run on this node: ${message}`);
    this.phase = "Failed";
    this.reason = reason;
    this.message = message;
    this.container = {
      kind: "terminated",
      exitCode: 128,
      reason: "ContainerCannotRun",
      message,
      startedAt: this.startTime,
      finishedAt: isoNow(),
    };
    await this.writeStatus(pod);
    return 0;
  }

  // ---- volumes ---------------------------------------------------------------------------

  private async setUp(pod: PodObject): Promise<void> {
    this.plans = await this.resolve(pod);
    const used = this.spec?.volume;
    if (used) {
      const plan = this.plans.find((p) => p.podVolume === used.name);
      if (plan === undefined)
        throw new PodFailure(
          "UnsupportedVolume",
          `the workload's volume "${used.name}" is not a PersistentVolumeClaim volume`,
        );
      // As kubelet refuses it: a Block volume is a volumeDevice, a Filesystem one a volumeMount.
      if ((plan.mode === "Block") !== (used.kind === "device"))
        throw new PodFailure(
          "UnsupportedVolume",
          `volume "${used.name}" has volumeMode ${plan.mode}, but is used as a ${used.kind === "device" ? "volumeDevice" : "volumeMount"}`,
        );
    }
    for (const p of this.plans) this.ctx.wanted.want(this.uid, p.volumeHandle, p.uniqueName);
    // kubelet mounts a controller-attached volume only once it is reported in use.
    await this.ctx.node.flushVolumesInUse();
    for (const p of this.plans) p.publishContext = await this.attached(p);
    this.tornDown = false;
    for (const p of this.plans) {
      if (this.ctx.caps.stageUnstage) {
        await this.ctx.volumes.stage(p);
        this.log.info(`volume "${p.podVolume}" (${p.pvName}) staged at ${p.stagingPath}`);
      }
      await this.ctx.volumes.publish(p, {
        podUID: this.uid,
        publishPath: p.publishPath,
        readOnly: p.readOnly,
      });
      this.log.info(
        `volume "${p.podVolume}" (${p.pvName}) published at ${p.publishPath}${p.readOnly ? " read-only" : ""}`,
      );
    }
    this.ready = true;
    this.waiting = undefined;
    this.message = undefined;
  }

  private async resolve(pod: PodObject): Promise<VolumePlan[]> {
    const ns = pod.metadata.namespace ?? "default";
    const plans: VolumePlan[] = [];
    for (const vol of pod.spec.volumes ?? []) {
      const claim = vol.persistentVolumeClaim;
      if (!claim) continue; // not a CSI concern of this stand-in
      let pvc: k8s.V1PersistentVolumeClaim;
      try {
        pvc = await this.ctx.core.readNamespacedPersistentVolumeClaim({
          name: claim.claimName,
          namespace: ns,
        });
      } catch (err) {
        if (notFound(err)) throw new NotYet(`persistentvolumeclaim "${claim.claimName}" not found`);
        throw kubeError(err, `get persistentvolumeclaim ${claim.claimName}`);
      }
      const pvName = pvc.spec?.volumeName;
      if (pvc.status?.phase !== "Bound" || !pvName)
        throw new NotYet(`persistentvolumeclaim "${claim.claimName}" is not bound yet`);
      let pv: k8s.V1PersistentVolume;
      try {
        pv = await this.ctx.core.readPersistentVolume({ name: pvName });
      } catch (err) {
        if (notFound(err)) throw new NotYet(`persistentvolume "${pvName}" not found`);
        throw kubeError(err, `get persistentvolume ${pvName}`);
      }
      const csi = pv.spec?.csi;
      if (!csi)
        throw new PodFailure(
          "UnsupportedVolume",
          `volume "${vol.name}": PersistentVolume ${pvName} is not a CSI volume; this node serves only CSI driver ${this.ctx.driver}`,
        );
      if (csi.driver !== this.ctx.driver)
        throw new PodFailure(
          "UnsupportedVolume",
          `volume "${vol.name}": PersistentVolume ${pvName} uses CSI driver ${csi.driver}; this node serves only ${this.ctx.driver}`,
        );
      const mode: VolumeMode = volumeModeOf(pv);
      const where = { driver: this.ctx.driver, volumeHandle: csi.volumeHandle, pvName, mode };
      plans.push({
        podVolume: vol.name,
        claimName: claim.claimName,
        readOnly: claim.readOnly === true,
        pvName,
        volumeHandle: csi.volumeHandle,
        mode,
        uniqueName: uniqueVolumeName(this.ctx.driver, csi.volumeHandle),
        attachmentID: attachmentName(csi.volumeHandle, this.ctx.driver, this.ctx.nodeName),
        stagingPath: stagingPath(this.ctx.rootDir, where),
        publishPath: publishPath(this.ctx.rootDir, { podUID: this.uid, pvName, mode }),
        capability: volumeCapabilityOf(pv),
        volumeContext: { ...(csi.volumeAttributes ?? {}) },
        publishContext: {},
        stageSecrets: await this.secrets(csi.nodeStageSecretRef),
        publishSecrets: await this.secrets(csi.nodePublishSecretRef),
      });
    }
    return plans;
  }

  private async secrets(ref: k8s.V1SecretReference | undefined): Promise<Record<string, string>> {
    if (!ref?.name) return {};
    try {
      const s = await this.ctx.core.readNamespacedSecret({
        name: ref.name,
        namespace: ref.namespace ?? "default",
      });
      return Object.fromEntries(
        Object.entries(s.data ?? {}).map(([k, b64]) => [k, Buffer.from(b64, "base64").toString("utf8")]),
      );
    } catch (err) {
      if (notFound(err)) throw new NotYet(`secret ${ref.namespace}/${ref.name} not found`);
      throw kubeError(err, `get secret ${ref.name}`);
    }
  }

  /** The attachment's publish context once the volume is attached to this node; NotYet before. */
  private async attached(p: VolumePlan): Promise<Record<string, string>> {
    const node = await this.ctx.core.readNode({ name: this.ctx.nodeName });
    const listed = (node.status?.volumesAttached ?? []).some((a) => a.name === p.uniqueName);
    let va: k8s.V1VolumeAttachment | undefined;
    try {
      va = await this.ctx.storage.readVolumeAttachment({ name: p.attachmentID });
    } catch (err) {
      if (!notFound(err)) throw kubeError(err, `get volumeattachment ${p.attachmentID}`);
    }
    const what = `volume "${p.podVolume}" (${p.pvName})`;
    const attachError = va?.status?.attachError?.message;
    if (attachError)
      throw new NotYet(
        `${what} is not attached yet: VolumeAttachment ${p.attachmentID} reports: ${attachError}`,
      );
    if (!va?.status?.attached || !listed) {
      const state = !va ? "not created yet" : va.status?.attached ? "attached" : "not attached yet";
      throw new NotYet(
        `waiting for ${what} to be attached: VolumeAttachment ${p.attachmentID} ${state}${listed ? "" : "; not in node.status.volumesAttached yet"}`,
      );
    }
    this.log.info(`${what} attached to ${this.ctx.nodeName} (VolumeAttachment ${p.attachmentID})`);
    return { ...(va.status.attachmentMetadata ?? {}) };
  }

  /** Unpublishes every publication of this Pod, unstages what no one else uses, drops volumesInUse. */
  private async teardown(): Promise<void> {
    const handles = new Set(this.plans.map((p) => p.volumeHandle));
    for (const rec of this.ctx.volumes.publicationsOf(this.uid)) {
      handles.add(rec.volumeHandle);
      await this.ctx.volumes.unpublish(rec);
      this.log.info(`volume ${rec.specVolID} unpublished from ${rec.publishPath}`);
    }
    this.ready = false;
    this.ctx.wanted.release(this.uid);
    for (const handle of handles) {
      if ((await this.ctx.volumes.unstageIfUnused(handle, (h) => this.ctx.wanted.isWanted(h))) === "unstaged")
        this.log.info(`volume ${handle} unstaged`);
    }
    await this.ctx.node.flushVolumesInUse();
    await this.ctx.volumes.removePodDirIfEmpty(this.uid);
    this.tornDown = true;
  }

  private async syncDeleted(pod: PodObject | undefined): Promise<undefined> {
    this.deleting = true;
    if (this.workload) {
      const w = this.workload;
      this.log.info("pod deleted; stopping its workload");
      await w.stop(Math.min((pod?.spec.terminationGracePeriodSeconds ?? 30) * 1000, this.ctx.killGraceMs));
      this.workload = undefined;
    }
    await this.teardown();
    if (pod !== undefined && this.key !== undefined) {
      // What kubelet does once a deleted Pod is fully stopped: remove the object for good.
      try {
        await this.ctx.core.deleteNamespacedPod({
          name: pod.metadata.name,
          namespace: pod.metadata.namespace ?? "default",
          // In the body: client-node's query parameter loses to the DeleteOptions body it sends.
          body: { gracePeriodSeconds: 0, preconditions: { uid: this.uid } },
        });
      } catch (err) {
        const e = kubeError(err, `delete pod ${this.key}`);
        if (e.kind !== "not-found" && e.kind !== "conflict") throw e;
      }
      this.log.info("pod deleted after its volumes were torn down");
    }
    this.done = true;
    this.ctx.finished(this.uid);
    return undefined;
  }

  // ---- workload --------------------------------------------------------------------------

  private start(pod: PodObject): void {
    const spec = this.spec;
    // A sync that outlived shutdown() must not leave a process behind.
    if (spec === undefined || this.done || this.ctx.stopping()) return;
    const plan = spec.volume ? this.plans.find((p) => p.podVolume === spec.volume?.name) : undefined;
    const target = plan
      ? {
          kind: spec.volume?.kind === "device" ? ("device" as const) : ("dir" as const),
          path: plan.publishPath,
        }
      : undefined;
    const argv = formatWorkloadArgs({
      ...spec.args,
      ...(spec.args.mode !== "hold" && target ? { target } : {}),
    });
    const w = startWorkload(argv, {
      logger: this.log,
      onResult: (line) => {
        this.message = line;
        this.kick();
      },
    });
    this.workload = w;
    this.phase = "Running";
    this.message = undefined;
    this.container = { kind: "running", startedAt: w.startedAt };
    this.log.info(`workload started: ${argv.join(" ")}`, { pid: w.pid, restartCount: this.restartCount });
    void w.exited.then((exit) => this.onExit(w, exit, pod.spec.restartPolicy ?? "Always"));
  }

  private onExit(w: RunningWorkload, exit: WorkloadExit, restartPolicy: string): void {
    if (this.workload !== w) return;
    this.workload = undefined;
    if (this.deleting || this.done || this.ctx.stopping()) return;
    const state: ContainerState & { kind: "terminated" } = {
      kind: "terminated",
      exitCode: exit.exitCode,
      reason: exit.exitCode === 0 ? "Completed" : "Error",
      message: exit.message,
      startedAt: exit.startedAt,
      finishedAt: exit.finishedAt,
    };
    this.log.info(`workload finished with exit code ${exit.exitCode}`, { result: exit.message });
    this.message = exit.message || undefined;
    if (restartPolicy === "Never" || (restartPolicy === "OnFailure" && exit.exitCode === 0)) {
      this.phase = exit.exitCode === 0 ? "Succeeded" : "Failed";
      this.container = state;
    } else {
      this.lastTerminated = state;
      this.restartCount++;
      const backoff = Math.min(1000 * 2 ** (this.restartCount - 1), 30_000);
      this.restartAt = Date.now() + backoff;
      this.container = {
        kind: "waiting",
        reason: "CrashLoopBackOff",
        message: `back-off ${Math.round(backoff / 1000)}s restarting failed container`,
      };
    }
    this.kick();
  }

  // ---- status ----------------------------------------------------------------------------

  private async writeStatus(pod: PodObject): Promise<void> {
    if (this.ctx.stopping() || this.deleting || this.frozen) return;
    const status = podStatus(
      pod,
      {
        phase: this.phase,
        container: this.container,
        ...(this.lastTerminated ? { lastTerminated: this.lastTerminated } : {}),
        restartCount: this.restartCount,
        volumesReady: this.ready,
        ...(this.waiting ? { waitingMessage: this.waiting } : {}),
        ...(this.message ? { message: this.message } : {}),
        ...(this.reason ? { reason: this.reason } : {}),
        startTime: this.startTime,
        hostIP: "127.0.0.1",
      },
      isoNow(),
    );
    // Transition times aside, an unchanged status is not written again.
    const signature = JSON.stringify(status, (k, val) => (k === "lastTransitionTime" ? undefined : val));
    if (signature === this.lastWritten) return;
    try {
      await this.ctx.core.patchNamespacedPodStatus(
        { name: pod.metadata.name, namespace: pod.metadata.namespace ?? "default", body: { status } },
        k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.StrategicMergePatch),
      );
      this.lastWritten = signature;
    } catch (err) {
      const e = kubeError(err, `update status of pod ${this.key}`);
      if (e.kind !== "not-found") throw e;
    }
  }

  // ---- expansion -------------------------------------------------------------------------

  /**
   * kubelet's half of volume expansion: a claim waiting for the node gets NodeExpandVolume to
   * its PV's capacity, with the claim status kubelet writes before and after (expansion.ts).
   */
  private async expandIfAsked(pod: PodObject): Promise<void> {
    if (!this.ctx.caps.expand) return;
    const core = this.ctx.core;
    for (const p of this.plans) {
      const pvc = await core.readNamespacedPersistentVolumeClaim({
        name: p.claimName,
        namespace: pod.metadata.namespace ?? "default",
      });
      if (!wantsNodeExpansion(pvc)) continue;
      const pub = this.ctx.volumes.publication(this.uid, p.pvName);
      const size = (await core.readPersistentVolume({ name: p.pvName })).spec?.capacity?.storage;
      if (pub === undefined || size === undefined) continue;
      let latest = pvc;
      if (pvc.status?.allocatedResourceStatuses?.storage === "NodeResizePending")
        latest = await patchClaimStatus(core, latest, expansionStartedStatus());
      this.log.info(`expanding volume "${p.podVolume}" (${p.pvName}) to ${size} on the node`);
      let grown: bigint;
      try {
        grown = await this.ctx.volumes.expand(pub, {
          requiredBytes: quantityBytes(size),
          capability: p.capability,
        });
      } catch (err) {
        await patchClaimStatus(
          core,
          latest,
          expansionFailedStatus(latest, errorMessage(err), isoNow()),
        ).catch(() => {});
        throw err;
      }
      await patchClaimStatus(core, latest, expansionFinishedStatus(latest, size));
      this.log.info(`volume "${p.podVolume}" (${p.pvName}) expanded on the node to ${size}`, {
        reportedBytes: String(grown),
      });
    }
  }
}
