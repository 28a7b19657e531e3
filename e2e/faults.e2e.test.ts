// Seeded fault injection: each round takes one volume through create, attach (write on the first
// consumer node), detach, verify (on the second) and delete, and kill -9s one component (leading
// manager, agent, csi controller, emulated nvmf_tgt, or the writer's whole node: kubelet and
// container runtime, then brought back) at a planned point of one phase; the round then requires
// convergence, the data intact byte for byte, nothing left behind and a healthy system.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import * as k8s from "@kubernetes/client-node";
import { externalIdFor, nqnFor } from "../agent/partitions/identity.ts";
import { kinds, type NVMeDevice, type NVMePartition, type NVMeVolumeAttachment } from "../api/index.ts";
import { tail } from "../lab/procs.ts";
import { kubeError, ResourceClient } from "../lib/kube/resource.ts";
import { createLogger } from "../lib/log.ts";
import { SpdkClient } from "../lib/spdk/client.ts";
import { SpdkMethods } from "../lib/spdk/methods.ts";
import { roundUpToUnit } from "../lib/units.ts";
import {
  BLOCK_ROUNDS,
  type Component,
  describeRound,
  describeTrigger,
  faultPlan,
  type InjectedFault,
  PHASES,
  type Phase,
  parseRounds,
  parseSeed,
  type RoundPlan,
  type Step,
  summarizeFaults,
} from "./fault-plan.ts";
import { stagingPath } from "./kubelet/naming.ts";
import {
  createPvc,
  type E2eLab,
  e2eLab,
  until,
  type WorkloadReport,
  workloadPod,
  workloadReport,
} from "./support.ts";
import { eventsAbout, waitHeld } from "./user-steps.ts";

const DRIVER = "storage.distort.io";
const LEASE = "distort-manager";
const CLAIM = "data";
/** Every wait for convergence: generous, since other labs share this 2-core machine. */
const WAIT_MS = 240_000;
const ROUND_TIMEOUT_MS = 15 * 60_000;

const seed = parseSeed(process.env.DISTORT_FAULT_SEED);
const rounds = parseRounds(process.env.DISTORT_FAULT_ROUNDS, 2 * BLOCK_ROUNDS);
const plan = faultPlan(seed, rounds);
console.log(`fault seed: ${seed} (rerun with DISTORT_FAULT_SEED=${seed})`);

const injected: InjectedFault[] = [];
let lab: E2eLab;
let partitions: ResourceClient<NVMePartition>;
let devices: ResourceClient<NVMeDevice>;
let nvmeVas: ResourceClient<NVMeVolumeAttachment>;
let spdk: { node: string; client: SpdkClient; methods: SpdkMethods }[] = [];
let coordination: k8s.CoordinationV1Api;

beforeAll(async () => {
  lab = await e2eLab();
  partitions = new ResourceClient(lab.conn, kinds.NVMePartition);
  devices = new ResourceClient(lab.conn, kinds.NVMeDevice);
  nvmeVas = new ResourceClient(lab.conn, kinds.NVMeVolumeAttachment);
  coordination = lab.conn.api(k8s.CoordinationV1Api);
  spdk = lab.storage.map((s) => {
    const client = new SpdkClient({
      socketPath: s.spdkSocket,
      logger: createLogger({ level: "error" }),
      callTimeoutMs: 10_000,
      reconnect: { initialMs: 100, maxMs: 1000 },
    });
    return { node: s.name, client, methods: new SpdkMethods(client) };
  });
  for (const p of plan) console.log(`plan ${describeRound(p)}`);
}, 900_000);

afterAll(async () => {
  for (const line of summarizeFaults(injected)) console.log(line);
  console.log(`fault seed was ${seed} (rerun with DISTORT_FAULT_SEED=${seed})`);
  await Promise.all(spdk.map((s) => s.client.close()));
  await lab?.stop();
}, 300_000);

/** One round's moving parts: what the driver has learnt and done, and when. */
class Round {
  readonly t0 = performance.now();
  readonly startedAt = new Date().toISOString();
  readonly timeline: string[] = [];
  readonly marks = new Set<Step>();
  ns = "";
  pv: string | undefined;
  volumeHandle: string | undefined;
  partition: { namespace: string; name: string; uid: string } | undefined;
  /** The storage node the partition was placed on, remembered after it is gone. */
  storageNode: string | undefined;
  killed: { name: string; pid: number; node?: string; inProgress: boolean } | undefined;
  #phaseStarted = new Map<Phase, () => void>();
  #last = new Map<string, string>();
  readonly started: Record<Phase, Promise<void>>;
  readonly ended = new Set<Phase>();
  /** Set when the round is over (passed or failed): a fault still pending must not fire later. */
  aborted = false;

  constructor(readonly plan: RoundPlan) {
    const started = {} as Record<Phase, Promise<void>>;
    for (const ph of PHASES)
      started[ph] = new Promise<void>((resolve) => this.#phaseStarted.set(ph, resolve));
    this.started = started;
  }

  note(s: string): void {
    const line = `+${((performance.now() - this.t0) / 1000).toFixed(1).padStart(6)} s  ${s}`;
    this.timeline.push(line);
    if (process.env.DISTORT_FAULT_VERBOSE === "1") console.log(`  [round ${this.plan.round}] ${line}`);
  }

  /** Notes what a poll sees only when it differs from what it saw last, so polling does not flood. */
  noteChange(key: string, s: string): void {
    if (this.#last.get(key) === s) return;
    this.#last.set(key, s);
    this.note(s);
  }

  begin(ph: Phase): void {
    this.note(`phase ${ph} starts`);
    this.#phaseStarted.get(ph)?.();
  }

  end(ph: Phase): void {
    this.ended.add(ph);
    this.note(`phase ${ph} done`);
  }

  abort(): void {
    this.aborted = true;
    for (const start of this.#phaseStarted.values()) start();
  }
}

describe(`faults (seed ${seed}, ${rounds} rounds)`, () => {
  for (const p of plan) {
    test(
      describeRound(p),
      async () => {
        const r = new Round(p);
        try {
          await runRound(r);
          console.log(
            `round ${p.round} ok in ${((performance.now() - r.t0) / 1000).toFixed(1)} s: ` +
              `killed ${r.killed?.name} (pid ${r.killed?.pid}) during ${p.phase}, ${describeTrigger(p.trigger)}` +
              (r.killed?.inProgress ? "" : " (after the phase's work had finished)") +
              (await sweptBy(r)),
          );
        } catch (err) {
          console.log(await diagnose(r, err));
          throw err;
        } finally {
          r.abort();
          if (r.ns) await lab.core.deleteNamespace({ name: r.ns }).catch(() => undefined);
        }
      },
      ROUND_TIMEOUT_MS,
    );
  }
});

async function runRound(r: Round): Promise<void> {
  const p = r.plan;
  const [writerNode, readerNode] = lab.consumers;
  if (!writerNode || !readerNode) throw new Error("the fault suite needs two consumer nodes");
  r.ns = await lab.newNamespace(`fault-${p.round}`);
  r.note(`namespace ${r.ns}`);
  const fault = injectFault(r);
  // Awaited when its phase settles; until then a failure must not surface as an unhandled rejection.
  fault.catch(() => undefined);
  // A phase that is not the planned one must not wait for the fault; the planned one waits for it
  // before the next phase starts, so a kill is never attributed to a later phase.
  const settle = async (ph: Phase) => {
    r.end(ph);
    if (p.phase === ph) await fault;
  };
  const bytes = `--bytes=${p.bytes}`;
  const dataSeed = `--seed=${p.dataSeed}`;
  const writerArgs = ["write", bytes, dataSeed, ...(p.writerHolds ? ["--then-hold"] : [])];
  const wffc = p.storageClass === "distort-lab";

  // create: the claim is provisioned (for WaitForFirstConsumer, once the writer is scheduled).
  r.begin("create");
  await createPvc(lab, r.ns, CLAIM, { storageClass: p.storageClass, size: "1Gi" });
  if (wffc) await createPod(r, "writer", writerNode.name, writerArgs);
  const bound = await until(`PVC ${r.ns}/${CLAIM} Bound with its partition`, () => boundVolume(r), WAIT_MS);
  r.pv = bound.pv;
  r.volumeHandle = bound.handle;
  r.partition = bound.partition;
  r.note(
    `bound to ${r.pv}; partition ${bound.partition.namespace}/${bound.partition.name} uid ${bound.partition.uid}`,
  );
  await until("the partition's placement", async () => (await currentPartition(r)) && r.storageNode, WAIT_MS);
  await settle("create");

  // attach: the writer on worker-a writes the pattern.
  r.begin("attach");
  if (!wffc) await createPod(r, "writer", writerNode.name, writerArgs);
  const written = await waitPod(r, "writer", p.writerHolds);
  r.note(`writer wrote ${written.bytes} bytes, sha256 ${written.sha256}`);
  expect(written).toMatchObject({ mode: "write", bytes: p.bytes, ok: true });
  await settle("attach");

  // detach: the writer goes; its node unpublishes, unstages and the volume is detached.
  r.begin("detach");
  await deletePodNow(r, "writer");
  r.marks.add("pod-deletion-requested");
  await waitDetached(r, "writer", writerNode);
  await settle("detach");

  // The data, read back on the other node once every fault so far is behind it.
  await createPod(r, "reader", readerNode.name, ["verify", bytes, dataSeed]);
  const read = await waitPod(r, "reader", false);
  r.note(`reader read ${read.bytes} bytes, sha256 ${read.sha256}, ok ${read.ok}`);
  expect(read).toMatchObject({ mode: "verify", bytes: p.bytes, ok: true, sha256: written.sha256 });
  await deletePodNow(r, "reader");
  await waitDetached(r, "reader", readerNode);

  // delete: the claim goes, and with it everything that stood for the volume.
  r.begin("delete");
  await lab.core.deleteNamespacedPersistentVolumeClaim({ name: CLAIM, namespace: r.ns });
  r.marks.add("pvc-deletion-requested");
  await waitNothingLeft(r);
  await settle("delete");

  // The killed process is back, and the whole system is healthy again.
  const k = r.killed;
  if (!k) throw new Error("the planned fault was never injected");
  const pid = await lab.waitRestarted(k.name, k.pid, WAIT_MS);
  r.note(`${k.name} restarted as pid ${pid}`);
  await until("every lab process running", () => allRunning(r), WAIT_MS);
  await until("a live manager holds the lease", () => leader(), WAIT_MS);
  await until("every storage node Ready and every drive Claimed", () => storageHealthy(r), WAIT_MS);
  await until(
    "every device's ledger consistent with the live partitions",
    () => ledgersConsistent(r),
    WAIT_MS,
  );
  r.note("system healthy");
}

// ---- the fault ------------------------------------------------------------------------------

async function injectFault(r: Round): Promise<void> {
  const p = r.plan;
  await r.started[p.phase];
  if (p.trigger.kind === "delay") {
    // The planned moment of the fault itself, not a wait for anything to happen.
    await Bun.sleep(p.trigger.ms);
  } else {
    const step = p.trigger.step;
    await until(`step "${step}"`, async () => r.aborted || (await stepReached(r, step)), WAIT_MS);
    if (!r.aborted) r.note(`step ${step} observed`);
  }
  const target = await until(
    `the ${p.component} to kill`,
    async () => (r.aborted ? { name: "" } : await processToKill(r, p.component)),
    WAIT_MS,
  );
  if (r.aborted) return;
  const inProgress = !r.ended.has(p.phase);
  const crash = p.component === "node" && target.node !== undefined;
  const pid = crash ? await lab.crashNode(target.node as string) : await lab.kill(target.name);
  r.killed = { ...target, pid, inProgress };
  injected.push({ round: p.round, phase: p.phase, component: p.component, inProgress });
  r.note(
    `killed ${crash ? `node ${target.node} (kubelet pid ${pid})` : `${target.name} (pid ${pid})`}` +
      (inProgress ? "" : " just after the phase's work finished"),
  );
  if (crash) {
    // The node comes back, as a crashed machine reboots; its Pods' containers kept running.
    await lab.restoreNode(target.node as string);
    r.note(`node ${target.node} back`);
  }
}

/** The running process that stands for `component` now; undefined while there is none to kill. */
async function processToKill(
  r: Round,
  component: Component,
): Promise<{ name: string; node?: string } | undefined> {
  let name: string;
  let node: string | undefined;
  if (component === "manager") {
    const m = await leader();
    if (!m) return undefined;
    name = m;
  } else if (component === "csi-controller") name = lab.csiController;
  else if (component === "node") {
    // The writer's node: where the volume is staged, published and unstaged.
    const writer = lab.consumers[0];
    if (!writer) throw new Error("the lab has no consumer node");
    name = writer.kubelet;
    node = writer.name;
  } else {
    await currentPartition(r);
    const placed = r.storageNode;
    const s =
      lab.storage.find((x) => x.name === placed) ??
      lab.storage[r.plan.fallbackStorageNode % lab.storage.length];
    if (!s) throw new Error("the lab has no storage node");
    name = component === "agent" ? s.agent : s.target;
    node = s.name;
  }
  return lab.pid(name) === undefined ? undefined : { name, ...(node ? { node } : {}) };
}

/** The manager process holding an unexpired Lease; its holderIdentity is "<POD_NAME>_<random>". */
async function leader(): Promise<string | undefined> {
  const lease = await coordination.readNamespacedLease({ name: LEASE, namespace: lab.namespace });
  const holder = lease.spec?.holderIdentity ?? "";
  const renewed = lease.spec?.renewTime ? new Date(lease.spec.renewTime).getTime() : 0;
  const ttl = (lease.spec?.leaseDurationSeconds ?? 0) * 1000;
  if (!holder || renewed + ttl < Date.now()) return undefined;
  const m = lab.managers.find((name) => holder === name || holder.startsWith(`${name}_`));
  return m !== undefined && lab.pid(m) !== undefined ? m : undefined;
}

async function stepReached(r: Round, step: Step): Promise<boolean> {
  switch (step) {
    case "pod-deletion-requested":
    case "pvc-deletion-requested":
      return r.marks.has(step);
    case "partition-created":
      return (await currentPartition(r)) !== undefined;
    case "partition-placed":
      return (await currentPartition(r))?.spec.nodeName !== undefined;
    case "partition-exported":
      return (await currentPartition(r))?.status?.state === "Exported";
    case "volumeattachment-created":
      return (await attachmentsOf(r)).some((va) => va.spec.nodeName === lab.consumers[0]?.name);
    case "nvmeva-created":
      return (await nvmeAttachmentsOf(r)).length > 0;
    case "node-staged": {
      const node = lab.consumers[0];
      return node !== undefined && stagedOn(r, node);
    }
    case "volumeattachment-deleting": {
      const va = (await attachmentsOf(r)).find((x) => x.spec.nodeName === lab.consumers[0]?.name);
      return va === undefined || va.metadata?.deletionTimestamp !== undefined;
    }
    case "partition-deleting": {
      if (!r.partition) return false;
      const part = await partitions.get(r.partition.name, r.partition.namespace);
      return (
        part === undefined ||
        part.metadata.uid !== r.partition.uid ||
        part.metadata.deletionTimestamp !== undefined
      );
    }
  }
}

// ---- observing the volume ---------------------------------------------------------------------

/** The round's partition: by the PV's handle once bound, by the claim's annotations before. */
async function currentPartition(r: Round): Promise<NVMePartition | undefined> {
  let part: NVMePartition | undefined;
  if (r.partition) {
    const p = await partitions.get(r.partition.name, r.partition.namespace);
    part = p?.metadata.uid === r.partition.uid ? p : undefined;
  } else
    part = (await partitions.list()).items.find(
      (p) =>
        p.metadata.annotations?.["storage.distort.io/pvc-name"] === CLAIM &&
        p.metadata.annotations["storage.distort.io/pvc-namespace"] === r.ns,
    );
  if (part?.spec.nodeName && !r.storageNode) {
    r.storageNode = part.spec.nodeName;
    r.note(`partition placed on ${part.spec.nodeName} drive ${part.spec.deviceSerial}`);
  }
  return part;
}

async function boundVolume(
  r: Round,
): Promise<
  { pv: string; handle: string; partition: { namespace: string; name: string; uid: string } } | undefined
> {
  const pvc = await lab.core.readNamespacedPersistentVolumeClaim({ name: CLAIM, namespace: r.ns });
  const pvName = pvc.spec?.volumeName;
  if (pvc.status?.phase !== "Bound" || !pvName) return undefined;
  const pv = await lab.core.readPersistentVolume({ name: pvName });
  const handle = pv.spec?.csi?.volumeHandle ?? "";
  const [namespace, name, uid] = handle.split("/");
  return namespace && name && uid ? { pv: pvName, handle, partition: { namespace, name, uid } } : undefined;
}

async function attachmentsOf(r: Round): Promise<k8s.V1VolumeAttachment[]> {
  if (!r.pv) return [];
  const vas = await lab.storageApi.listVolumeAttachment();
  return vas.items.filter(
    (va) => va.spec.attacher === DRIVER && va.spec.source.persistentVolumeName === r.pv,
  );
}

async function nvmeAttachmentsOf(r: Round): Promise<NVMeVolumeAttachment[]> {
  const uid = r.partition?.uid;
  if (!uid) return [];
  return (await nvmeVas.list()).items.filter((a) => a.spec.partitionUID === uid);
}

/** A consumer node as the round looks at it: its name and kubelet root (host paths, as lab.mountPoints gives). */
type Consumer = { name: string; kubeletRoot: string };

function stagedOn(r: Round, node: Consumer): boolean {
  if (!r.volumeHandle || !r.pv) return false;
  const path = stagingPath(node.kubeletRoot, {
    driver: DRIVER,
    volumeHandle: r.volumeHandle,
    pvName: r.pv,
    mode: "Filesystem",
  });
  return lab.mountPoints(node.name).includes(path);
}

/** Any mount of the volume under the node's kubelet root: its staging path or a Pod's publish path. */
function mountedOn(r: Round, node: Consumer): boolean {
  if (stagedOn(r, node)) return true;
  const pv = r.pv;
  return (
    pv !== undefined &&
    lab.mountPoints(node.name).some((m) => m.startsWith(`${node.kubeletRoot}/pods/`) && m.includes(`/${pv}/`))
  );
}

// ---- Pods ----------------------------------------------------------------------------------

async function createPod(r: Round, name: string, node: string, args: string[]): Promise<void> {
  await lab.core.createNamespacedPod({ namespace: r.ns, body: workloadPod(name, node, CLAIM, args) });
  r.note(`Pod ${name} created on ${node}: ${args.join(" ")}`);
}

/** A Failed Pod is final: reported at once instead of polled until the deadline. */
type PodOutcome = { report: WorkloadReport } | { failed: string };

function outcome(pod: k8s.V1Pod): PodOutcome | undefined {
  if (pod.status?.phase === "Failed")
    return { failed: pod.status.message ?? JSON.stringify(pod.status.containerStatuses ?? []) };
  const report = pod.status?.phase === "Succeeded" ? workloadReport(pod) : undefined;
  return report ? { report } : undefined;
}

async function waitPod(r: Round, name: string, holding: boolean): Promise<WorkloadReport> {
  // A holding writer's result is its log line (a real kubelet) or status message (the stand-in).
  if (holding) return waitHeld(lab, r.ns, name, WAIT_MS);
  const o = await until(
    `Pod ${r.ns}/${name} to succeed`,
    async () => outcome(await lab.core.readNamespacedPod({ name, namespace: r.ns })),
    WAIT_MS,
  );
  if ("failed" in o) throw new Error(`Pod ${r.ns}/${name} failed: ${o.failed}`);
  return o.report;
}

async function deletePodNow(r: Round, name: string): Promise<void> {
  try {
    await lab.core.deleteNamespacedPod({ name, namespace: r.ns });
  } catch (err) {
    if (kubeError(err, "delete").kind !== "not-found") throw err;
  }
  r.note(`Pod ${name} deletion requested`);
}

/** The Pod is gone, its node unstaged the volume and no VolumeAttachment ties it to that node. */
async function waitDetached(r: Round, pod: string, node: Consumer): Promise<void> {
  await until(
    `Pod ${r.ns}/${pod} gone`,
    async () => !(await lab.core.readNamespacedPod({ name: pod, namespace: r.ns }).catch(() => undefined)),
    WAIT_MS,
  );
  await until(`volume unstaged and unpublished on ${node.name}`, async () => !mountedOn(r, node), WAIT_MS);
  await until(
    `no VolumeAttachment of ${r.pv} to ${node.name}`,
    async () => !(await attachmentsOf(r)).some((va) => va.spec.nodeName === node.name),
    WAIT_MS,
  );
  r.note(`${pod} gone; unstaged and detached from ${node.name}`);
}

/**
 * Who unstaged the round's volume where kubelet did not: a kubelet killed between unpublish and
 * unstage forgets the staging mount, and the node plugin's staging sweep unstages it and says so
 * in an Event on the partition (read at the round's end: the Event follows the unmount).
 */
async function sweptBy(r: Round): Promise<string> {
  const p = r.partition;
  if (!p) return "";
  const events = await eventsAbout(lab, p.namespace, "NVMePartition", p.name, p.uid).catch(() => []);
  const nodes = events
    .filter((e) => e.reason === "ForgottenStagingUnstaged")
    .map((e) => /^node (\S+):/.exec(e.message ?? "")?.[1] ?? "?");
  return nodes.length
    ? `; kubelet on ${nodes.join(", ")} forgot the staging mount, the staging sweep unstaged it`
    : "";
}

// ---- deletion and health ---------------------------------------------------------------------

async function waitNothingLeft(r: Round): Promise<void> {
  const part = r.partition;
  const pvName = r.pv;
  if (!part || !pvName) throw new Error("deleting a volume that was never bound");
  await until(
    `PVC ${r.ns}/${CLAIM} gone`,
    async () =>
      !(await lab.core
        .readNamespacedPersistentVolumeClaim({ name: CLAIM, namespace: r.ns })
        .catch(() => undefined)),
    WAIT_MS,
  );
  await until(
    `PV ${pvName} gone`,
    async () => !(await lab.core.readPersistentVolume({ name: pvName }).catch(() => undefined)),
    WAIT_MS,
  );
  await until(
    `NVMePartition ${part.namespace}/${part.name} gone`,
    async () => (await partitions.get(part.name, part.namespace))?.metadata.uid !== part.uid,
    WAIT_MS,
  );
  await until(`no VolumeAttachment of ${pvName}`, async () => (await attachmentsOf(r)).length === 0, WAIT_MS);
  await until(
    `no NVMeVolumeAttachment of uid ${part.uid}`,
    async () => (await nvmeAttachmentsOf(r)).length === 0,
    WAIT_MS,
  );
  const externalId = externalIdFor(part.uid);
  const nqn = nqnFor(externalId);
  for (const s of spdk) {
    // The target may be restarting after its own kill: an unreachable socket is retried, not passed.
    await until(
      `no subsystem ${nqn} and no lvol ${externalId} on ${s.node}`,
      async () => {
        const subsystems = await s.methods.nvmfGetSubsystems();
        const lvols = await s.methods.bdevLvolGetLvols();
        return !subsystems.some((x) => x.nqn === nqn) && !lvols.some((l) => l.name === externalId);
      },
      WAIT_MS,
    );
  }
  r.note(`nothing left of ${part.name}: no PVC, PV, partition, attachments, subsystem or lvol`);
}

/** Every process the lab keeps running has a live pid. */
async function allRunning(r: Round): Promise<boolean> {
  const names = lab.processNames();
  const down = names.filter((n) => lab.pid(n) === undefined);
  if (down.length > 0) r.noteChange("processes", `not running yet: ${down.join(", ")}`);
  return names.length > 0 && down.length === 0;
}

/** Each storage node reports Ready, and every lab drive is still Claimed (none Unavailable). */
async function storageHealthy(r: Round): Promise<boolean> {
  const problems: string[] = [];
  const nodes = new ResourceClient(lab.conn, kinds.RDMAStorageNode);
  for (const s of lab.storage) {
    const n = await nodes.get(s.name, lab.namespace);
    const ready = n?.status?.conditions?.find((c) => c.type === "Ready");
    if (ready?.status !== "True") problems.push(`${s.name} Ready=${ready?.status} ${ready?.message ?? ""}`);
  }
  const serials = new Set(lab.storage.flatMap((s) => s.serials));
  const devs = (await devices.list()).items.filter((d) => serials.has(d.spec.serial));
  for (const serial of serials) {
    const d = devs.find((x) => x.spec.serial === serial);
    if (d?.status?.phase !== "Claimed") problems.push(`drive ${serial} is ${d?.status?.phase ?? "missing"}`);
  }
  if (problems.length > 0) r.noteChange("storage", `storage: ${problems.join("; ")}`);
  return problems.length === 0;
}

/**
 * Each device's ledger names exactly the live partitions placed on it (same UID, namespace and
 * name, at least their rounded size), and its freeBytes is what the ledger leaves.
 */
async function ledgersConsistent(r: Round): Promise<boolean> {
  const problems = ledgerProblems((await devices.list()).items, (await partitions.list()).items);
  if (problems.length > 0) r.noteChange("ledger", `ledger: ${problems.join("; ")}`);
  return problems.length === 0;
}

function ledgerProblems(devs: NVMeDevice[], parts: NVMePartition[]): string[] {
  const out: string[] = [];
  for (const d of devs) {
    if (d.status?.phase !== "Claimed") continue;
    const placed = parts.filter(
      (p) => p.spec.nodeName === d.spec.nodeName && p.spec.deviceSerial === d.spec.serial,
    );
    const ledger = d.status.reservations ?? [];
    for (const e of ledger) {
      const p = placed.find((x) => x.metadata.uid === e.uid);
      if (!p)
        out.push(
          `${d.spec.serial}: entry ${e.namespace}/${e.name} (${e.uid}) has no live partition placed here`,
        );
      else if (
        p.metadata.namespace !== e.namespace ||
        p.metadata.name !== e.name ||
        e.bytes < roundUpToUnit(p.spec.sizeBytes)
      )
        out.push(`${d.spec.serial}: entry ${JSON.stringify(e)} does not match its partition`);
    }
    for (const p of placed)
      if (!ledger.some((e) => e.uid === p.metadata.uid))
        out.push(
          `${d.spec.serial}: partition ${p.metadata.namespace}/${p.metadata.name} is placed here without an entry`,
        );
    const committed = ledger.reduce((sum, e) => sum + e.bytes, 0);
    const free = Math.max(0, d.spec.allocatableBytes - committed);
    if (d.status.freeBytes !== free)
      out.push(`${d.spec.serial}: freeBytes ${d.status.freeBytes}, the ledger leaves ${free}`);
  }
  return out;
}

// ---- diagnosis ---------------------------------------------------------------------------------

/** Everything needed to understand a failed round without rerunning it. */
async function diagnose(r: Round, err: unknown): Promise<string> {
  const out: string[] = [
    `ROUND FAILED (seed ${seed}): ${describeRound(r.plan)}`,
    `error: ${String(err)}`,
    "timeline:",
  ];
  out.push(...r.timeline.map((l) => `  ${l}`));
  const section = async (title: string, fn: () => Promise<unknown>) => {
    try {
      out.push(`${title}: ${JSON.stringify(await fn(), null, 1)}`);
    } catch (e) {
      out.push(`${title}: (unreadable: ${String(e)})`);
    }
  };
  if (r.ns) {
    await section("PVC", async () => {
      const pvc = await lab.core.readNamespacedPersistentVolumeClaim({ name: CLAIM, namespace: r.ns });
      return {
        phase: pvc.status?.phase,
        volumeName: pvc.spec?.volumeName,
        annotations: pvc.metadata?.annotations,
      };
    });
    await section("Pods", async () =>
      (await lab.core.listNamespacedPod({ namespace: r.ns })).items.map((p) => ({
        name: p.metadata?.name,
        node: p.spec?.nodeName,
        phase: p.status?.phase,
        message: p.status?.message,
        conditions: p.status?.conditions?.map((c) => `${c.type}=${c.status} ${c.message ?? ""}`),
      })),
    );
    await section("Events", async () =>
      (await lab.core.listNamespacedEvent({ namespace: r.ns })).items.map(
        (e) => `${e.involvedObject.kind}/${e.involvedObject.name} ${e.reason}: ${e.message}`,
      ),
    );
  }
  if (r.pv) {
    const pvName = r.pv;
    await section("PV", async () => {
      const pv = await lab.core.readPersistentVolume({ name: pvName });
      return {
        phase: pv.status?.phase,
        handle: pv.spec?.csi?.volumeHandle,
        finalizers: pv.metadata?.finalizers,
      };
    });
  }
  await section("NVMePartition", async () => {
    const part = await currentPartition(r);
    if (!part) return "(none)";
    const { name, uid, deletionTimestamp, finalizers } = part.metadata;
    return {
      name,
      uid,
      deletionTimestamp,
      finalizers,
      placed: `${part.spec.nodeName}/${part.spec.deviceSerial}`,
      status: part.status,
    };
  });
  await section("VolumeAttachments", async () =>
    (await attachmentsOf(r)).map((va) => ({
      name: va.metadata?.name,
      node: va.spec.nodeName,
      attached: va.status?.attached,
      deleting: va.metadata?.deletionTimestamp,
      attachError: va.status?.attachError?.message,
      detachError: va.status?.detachError?.message,
    })),
  );
  await section("NVMeVolumeAttachments", async () =>
    (await nvmeAttachmentsOf(r)).map((a) => ({
      name: a.metadata.name,
      deleting: a.metadata.deletionTimestamp,
      finalizers: a.metadata.finalizers,
      spec: a.spec,
      status: a.status,
    })),
  );
  await section("ledger problems", async () =>
    ledgerProblems((await devices.list()).items, (await partitions.list()).items),
  );
  await section(
    "lease",
    async () => (await coordination.readNamespacedLease({ name: LEASE, namespace: lab.namespace })).spec,
  );
  await section("processes down", async () => lab.processNames().filter((n) => lab.pid(n) === undefined));
  // The killed process's own log, and what the others said about this volume.
  const logOf = (name: string) => join(lab.dir, "logs", `${name.replaceAll("/", "_")}.log`);
  if (r.killed) out.push(`log tail of ${r.killed.name}:`, tail(logOf(r.killed.name), 25));
  const needle = r.partition?.name;
  if (needle) {
    const names = [
      ...lab.managers,
      lab.csiController,
      ...lab.storage.flatMap((s) => [s.agent, s.target]),
      ...lab.consumers.flatMap((c) => [c.csi, c.kubelet]),
    ];
    for (const name of names) {
      let lines: string[] = [];
      try {
        lines = readFileSync(logOf(name), "utf8")
          .split("\n")
          // Start and exit markers of this round only: "--- <ISO time> ...".
          .filter((l) => l.includes(needle) || (l.startsWith("--- ") && l.slice(4) >= r.startedAt));
      } catch {
        continue;
      }
      out.push(`${name} (${logOf(name)}), lines naming ${needle}:`, ...lines.slice(-15).map((l) => `  ${l}`));
    }
  }
  return out.join("\n");
}
