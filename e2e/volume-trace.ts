// What one volume puts into the lab while a Pod uses it (API objects, the lvol and NVMe-oF subsystem
// on its storage node's target, the consumer's loop device and mounts, its device-ledger entry),
// read the way an operator would, and which of those are still there after the volume is deleted.
import { kinds, type NVMeDevice } from "../api/index.ts";
import { ResourceClient } from "../lib/kube/resource.ts";
import { createLogger } from "../lib/log.ts";
import { SpdkClient } from "../lib/spdk/client.ts";
import { SpdkMethods } from "../lib/spdk/methods.ts";
import type { Bdev, Lvol, NvmfSubsystem } from "../lib/spdk/schemas.ts";
import { sha256Hex } from "./kubelet/naming.ts";
import { hostNqnOf } from "./storage-target.ts";
import { type E2eLab, until } from "./support.ts";

/** Everything a volume in use was seen to have, captured while its Pod ran. */
export interface VolumeTrace {
  claim: { namespace: string; name: string; uid: string };
  pv: string;
  volumeHandle: string;
  partition: { namespace: string; name: string; uid: string };
  storageNode: string;
  device: { name: string; serial: string };
  externalId: string;
  nqn: string;
  lvolUuid: string;
  /** Where the lvol's bytes live in the emulated drive file; the consumer's loop device maps it. */
  extent: { filename: string; offset: number };
  consumer: { node: string; kubeletRoot: string; hostNqn: string };
  volumeAttachment: string;
  nvmeAttachment: string;
  loopDevice: string;
  mounts: string[];
  reservedBytes: number;
}

interface TargetState {
  node: string;
  lvols: Lvol[];
  bdevs: Bdev[];
  subsystems: NvmfSubsystem[];
}

const quiet = createLogger({ level: "error" });

/** The lvols, bdevs and subsystems of every storage node's target, over its RPC socket. */
export async function targetStates(lab: E2eLab): Promise<TargetState[]> {
  return Promise.all(
    lab.storage.map(async (s) => {
      const client = new SpdkClient({ socketPath: s.spdkSocket, logger: quiet, callTimeoutMs: 15_000 });
      try {
        const m = new SpdkMethods(client);
        return {
          node: s.name,
          lvols: await m.bdevLvolGetLvols(),
          bdevs: await m.bdevGetBdevs(),
          subsystems: await m.nvmfGetSubsystems(),
        };
      } finally {
        await client.close();
      }
    }),
  );
}

/** Loop devices with the offset into their backing file (lvols share one drive file). */
export function loopDevicesWithOffsets(): { name: string; backFile: string; offset: number }[] {
  const p = Bun.spawnSync(["losetup", "--list", "--json", "--output", "NAME,BACK-FILE,OFFSET"]);
  const text = p.stdout.toString().trim();
  if (p.exitCode !== 0 || !text) return [];
  const parsed = JSON.parse(text) as {
    loopdevices?: { name: string; "back-file": string | null; offset: number | string }[];
  };
  return (parsed.loopdevices ?? []).map((l) => ({
    name: l.name,
    backFile: (l["back-file"] ?? "").trim().replace(/ \(deleted\)$/, ""),
    offset: Number(l.offset),
  }));
}

/** Mount points under the consumer's kubelet root that belong to this volume (staging or publish). */
function volumeMounts(
  lab: E2eLab,
  node: string,
  kubeletRoot: string,
  pv: string,
  volumeHandle: string,
): string[] {
  const handleHash = sha256Hex(volumeHandle);
  return lab
    .mountPoints(node)
    .filter(
      (m) =>
        m.startsWith(`${kubeletRoot}/`) &&
        (m.includes(`/${pv}/`) || m.endsWith(`/${pv}`) || m.includes(`/${handleHash}/`)),
    );
}

function consumerOf(lab: E2eLab, node: string) {
  const c = lab.consumers.find((x) => x.name === node);
  if (!c) throw new Error(`${node} is not a consumer node of the lab`);
  return c;
}

/**
 * Captures the trace of claim `ns/claim` in use by a Pod on `node`; waits until every piece is
 * visible, and times out naming what is still missing.
 */
export async function captureVolume(
  lab: E2eLab,
  ns: string,
  claim: string,
  node: string,
): Promise<VolumeTrace> {
  const partitions = new ResourceClient(lab.conn, kinds.NVMePartition);
  const nvas = new ResourceClient(lab.conn, kinds.NVMeVolumeAttachment);
  const devices = new ResourceClient(lab.conn, kinds.NVMeDevice);
  const { kubeletRoot } = consumerOf(lab, node);
  const hostNqn = await hostNqnOf(lab, node);
  return until(`every trace of PVC ${ns}/${claim} in use on ${node}`, async () => {
    const pvc = await lab.core.readNamespacedPersistentVolumeClaim({ name: claim, namespace: ns });
    const pvName = pvc.spec?.volumeName;
    if (pvc.status?.phase !== "Bound" || !pvName) throw new Error("the PVC is not bound");
    const pv = await lab.core.readPersistentVolume({ name: pvName });
    const handle = pv.spec?.csi?.volumeHandle ?? "";
    const [pns, pname] = handle.split("/");
    if (!pns || !pname) throw new Error(`PV ${pvName} has volume handle ${JSON.stringify(handle)}`);
    const p = await partitions.get(pname, pns);
    if (!p?.metadata.uid || p.status?.state !== "Exported")
      throw new Error(`NVMePartition ${pns}/${pname} is not Exported`);
    const { externalId, nqn } = p.status;
    const storageNode = p.spec.nodeName;
    const serial = p.spec.deviceSerial;
    if (!externalId || !nqn || !storageNode || !serial)
      throw new Error(`NVMePartition ${pname} lacks placement or export status`);
    const va = (await lab.storageApi.listVolumeAttachment()).items.find(
      (a) => a.spec.source.persistentVolumeName === pvName && a.spec.nodeName === node,
    );
    if (!va?.status?.attached) throw new Error(`no attached VolumeAttachment of ${pvName} to ${node}`);
    const nva = (await nvas.list({ namespace: pns })).items.find(
      (a) => a.spec.partitionUID === p.metadata.uid,
    );
    if (!nva) throw new Error(`no NVMeVolumeAttachment for partition uid ${p.metadata.uid}`);
    if (nva.spec.hostNQN !== hostNqn)
      throw new Error(
        `NVMeVolumeAttachment ${nva.metadata.name} admits ${nva.spec.hostNQN}, not ${node}'s ${hostNqn}`,
      );
    const device = (await devices.list()).items.find(
      (d) => d.spec.serial === serial && d.spec.nodeName === storageNode,
    );
    const entry = device?.status?.reservations?.find((r) => r.uid === p.metadata.uid);
    if (!device || !entry)
      throw new Error(`no ledger entry for ${pname} on the device with serial ${serial}`);
    const target = (await targetStates(lab)).find((t) => t.node === storageNode);
    const lvol = target?.lvols.find((l) => l.name === externalId);
    if (!lvol) throw new Error(`no lvol ${externalId} on ${storageNode}`);
    const sub = target?.subsystems.find((s) => s.nqn === nqn);
    if (!sub?.hosts.some((h) => h.nqn === hostNqn))
      throw new Error(`subsystem ${nqn} does not admit ${hostNqn}`);
    const mounts = volumeMounts(lab, node, kubeletRoot, pvName, handle);
    if (mounts.length === 0) throw new Error(`nothing of ${pvName} mounted under ${kubeletRoot}`);
    // The namespace's block device on the node: a loop device over the node's NVMe host's file.
    const sources = new Set(mountSources(lab.mountinfo(node), mounts));
    const loop = loopDevicesWithOffsets().find(
      // Under the node's host driver state: <..>/nvme-host/state-<node>/fuse/.
      (l) => sources.has(l.name) && /\/nvme-host\/(state-[^/]+\/)?fuse\//.test(l.backFile),
    );
    if (!loop) throw new Error(`no namespace device of the node's NVMe host behind ${mounts.join(", ")}`);
    return {
      claim: { namespace: ns, name: claim, uid: pvc.metadata?.uid ?? "" },
      pv: pvName,
      volumeHandle: handle,
      partition: { namespace: pns, name: pname, uid: p.metadata.uid },
      storageNode,
      device: { name: device.metadata.name, serial },
      externalId,
      nqn,
      lvolUuid: lvol.uuid,
      extent: { filename: loop.backFile, offset: loop.offset },
      consumer: { node, kubeletRoot, hostNqn },
      volumeAttachment: va.metadata?.name ?? "",
      nvmeAttachment: nva.metadata.name,
      loopDevice: loop.name,
      mounts,
      reservedBytes: entry.bytes,
    };
  });
}

function finalizersOf(meta: { finalizers?: string[] } | undefined): string {
  return meta?.finalizers?.length ? ` (finalizers ${meta.finalizers.join(", ")})` : "";
}

/** What of the traced volumes is still there; empty once deletion left nothing. */
export async function residueOf(lab: E2eLab, traces: readonly VolumeTrace[]): Promise<string[]> {
  const left: string[] = [];
  const partitions = new ResourceClient(lab.conn, kinds.NVMePartition);
  const nvas = new ResourceClient(lab.conn, kinds.NVMeVolumeAttachment);
  const devices = (await new ResourceClient(lab.conn, kinds.NVMeDevice).list()).items;
  const vas = (await lab.storageApi.listVolumeAttachment()).items;
  const pvs = (await lab.core.listPersistentVolume()).items;
  const allNvas = (await nvas.list({ namespace: lab.namespace })).items;
  const allParts = (await partitions.list({ namespace: lab.namespace })).items;
  const targets = await targetStates(lab);
  const loops = loopDevicesWithOffsets();
  for (const t of traces) {
    const what = `PVC ${t.claim.namespace}/${t.claim.name}`;
    const pvc = await lab.core
      .readNamespacedPersistentVolumeClaim({ name: t.claim.name, namespace: t.claim.namespace })
      .catch(() => undefined);
    if (pvc?.metadata?.uid === t.claim.uid) left.push(`${what} still exists${finalizersOf(pvc.metadata)}`);
    const pv = pvs.find((x) => x.metadata?.name === t.pv);
    if (pv)
      left.push(`${what}: PV ${t.pv} still exists, phase ${pv.status?.phase}${finalizersOf(pv.metadata)}`);
    for (const va of vas.filter((a) => a.spec.source.persistentVolumeName === t.pv))
      left.push(
        `${what}: VolumeAttachment ${va.metadata?.name} to ${va.spec.nodeName} still exists${finalizersOf(va.metadata)}`,
      );
    for (const a of allNvas.filter((x) => x.spec.partitionUID === t.partition.uid))
      left.push(`${what}: NVMeVolumeAttachment ${a.metadata.name} still exists${finalizersOf(a.metadata)}`);
    const part = await partitions.get(t.partition.name, t.partition.namespace);
    if (part?.metadata.uid === t.partition.uid)
      left.push(
        `${what}: NVMePartition ${t.partition.name} still exists, state ${part.status?.state}${finalizersOf(part.metadata)}`,
      );
    for (const d of devices.filter((x) => x.status?.reservations?.some((r) => r.uid === t.partition.uid)))
      left.push(`${what}: device ${d.metadata.name} still holds a ledger entry for ${t.partition.name}`);
    for (const target of targets) {
      if (target.lvols.some((l) => l.name === t.externalId || l.uuid === t.lvolUuid))
        left.push(`${what}: lvol ${t.externalId} still on ${target.node}'s target`);
      if (target.bdevs.some((b) => b.name === t.lvolUuid))
        left.push(`${what}: bdev ${t.lvolUuid} still on ${target.node}'s target`);
      if (target.subsystems.some((s) => s.nqn === t.nqn))
        left.push(`${what}: subsystem ${t.nqn} still on ${target.node}'s target`);
    }
    for (const l of loops.filter((x) => x.name === t.loopDevice && x.backFile === t.extent.filename))
      left.push(`${what}: loop device ${l.name} still maps ${l.backFile}`);
    for (const m of volumeMounts(lab, t.consumer.node, t.consumer.kubeletRoot, t.pv, t.volumeHandle))
      left.push(`${what}: ${m} still mounted`);
  }
  // No target may still admit a traced consumer except to volumes a live attachment authorizes.
  for (const hostNqn of new Set(traces.map((t) => t.consumer.hostNqn))) {
    const authorized = new Set(
      allNvas
        .filter((a) => a.spec.hostNQN === hostNqn)
        .map((a) => allParts.find((p) => p.metadata.uid === a.spec.partitionUID)?.status?.nqn)
        .filter((n): n is string => n !== undefined),
    );
    for (const target of targets)
      for (const s of target.subsystems)
        if (s.hosts.some((h) => h.nqn === hostNqn) && !authorized.has(s.nqn))
          left.push(
            `subsystem ${s.nqn} on ${target.node}'s target still admits ${hostNqn}, which no attachment authorizes`,
          );
  }
  return left;
}

/** Waits until nothing of the traced volumes is left; the timeout names what still is. */
export async function waitNoResidue(
  lab: E2eLab,
  traces: readonly VolumeTrace[],
  timeoutMs = 240_000,
): Promise<void> {
  await until(
    `nothing left of ${traces.map((t) => `${t.claim.namespace}/${t.claim.name}`).join(", ")}`,
    async () => {
      const left = await residueOf(lab, traces);
      if (left.length > 0) throw new Error(`still there:\n  ${left.join("\n  ")}`);
      return true;
    },
    timeoutMs,
  );
}

/** Every device's free bytes and ledger entries (partition uid -> bytes) at one moment. */
export type LedgerView = Map<string, { freeBytes: number; entries: Map<string, number> }>;

export async function ledgerView(lab: E2eLab): Promise<LedgerView> {
  const items: NVMeDevice[] = (await new ResourceClient(lab.conn, kinds.NVMeDevice).list()).items;
  return new Map(
    items.map((d) => [
      d.metadata.name,
      {
        freeBytes: d.status?.freeBytes ?? 0,
        entries: new Map((d.status?.reservations ?? []).map((r) => [r.uid, r.bytes])),
      },
    ]),
  );
}

const total = (m: Map<string, number>) => [...m.values()].reduce((a, b) => a + b, 0);

/**
 * Devices whose freeBytes is not what it was in `before`, once the entries other partitions added
 * or dropped meanwhile are accounted for (so other suites' volumes on a shared lab do not count).
 */
export function ledgerDrift(before: LedgerView, after: LedgerView): string[] {
  const out: string[] = [];
  for (const [name, b] of before) {
    const a = after.get(name);
    if (!a) continue;
    const expected = b.freeBytes + total(b.entries) - total(a.entries);
    if (a.freeBytes !== expected)
      out.push(`device ${name}: freeBytes ${a.freeBytes}, expected ${expected} (was ${b.freeBytes} before)`);
  }
  return out;
}

/** Waits until every device's freeBytes is back to `before`, net of other partitions' entries. */
export async function waitLedgerRestored(
  lab: E2eLab,
  before: LedgerView,
  timeoutMs = 120_000,
): Promise<void> {
  await until(
    "the device ledger back to its state before the volumes",
    async () => {
      const drift = ledgerDrift(before, await ledgerView(lab));
      if (drift.length > 0) throw new Error(drift.join("; "));
      return true;
    },
    timeoutMs,
  );
}

/** The mount sources (devices) of these mount points, from a node's mount table. */
function mountSources(mountinfo: string, points: readonly string[]): string[] {
  const want = new Set(points);
  const out: string[] = [];
  for (const line of mountinfo.split("\n")) {
    const f = line.split(" ");
    if (!want.has(f[4] ?? "")) continue;
    const dash = f.indexOf("-");
    // A Block volume's publish target is a bind mount of the device node itself: its source is
    // the devtmpfs, and the device is the mount's root within it.
    const src = f[dash + 1] === "devtmpfs" ? `/dev${f[3] ?? ""}` : f[dash + 2];
    if (src) out.push(src);
  }
  return out;
}
