// What the storage target itself says about a claim's volume, read over the emulated nvmf_tgt's
// SPDK RPC socket (or, on a kernel-backend node, from nvmet's configfs tree): the subsystem's
// allowed hosts (and the order they changed in), the lvol's size, and the consumer host NQNs the
// ACL is compared with.
import { readdir, readFile } from "node:fs/promises";
import { join } from "node:path";
import type * as k8s from "@kubernetes/client-node";
import { kinds, type NVMePartition, type NVMeVolumeAttachment } from "../api/index.ts";
import { attachmentNameFor } from "../csi/controller/volume-id.ts";
import { parseNodeId } from "../lib/csi-node-id.ts";
import { ResourceClient } from "../lib/kube/resource.ts";
import { silentLogger } from "../lib/log.ts";
import { SpdkClient } from "../lib/spdk/client.ts";
import { SpdkMethods } from "../lib/spdk/methods.ts";
import { DRIVER_NAME } from "../lib/volume-context.ts";
import { type E2eLab, partitionOf, until } from "./support.ts";

/** Where a claim's volume lives on the target. */
export interface VolumeTarget {
  partition: NVMePartition;
  /** The subsystem exporting it. */
  nqn: string;
  /** The lvol bdev (its UUID). */
  bdev: string;
  storageNode: string;
  /** Which target serves it. */
  backend: "spdk" | "kernel";
  /** The node's nvmf_tgt RPC socket; "" on a kernel-backend node. */
  spdkSocket: string;
  /** The node's nvmet configfs directory; "" on an SPDK node. */
  nvmetDir: string;
  /** The partition's one NVMeVolumeAttachment (single-writer record), by name. */
  attachmentName: string;
}

/** An RPC connection to one storage node's target; close() it when done. */
export function targetRpc(socketPath: string): { rpc: SpdkMethods; close: () => Promise<void> } {
  const client = new SpdkClient({ socketPath, logger: silentLogger, callTimeoutMs: 10_000 });
  return { rpc: new SpdkMethods(client), close: () => client.close() };
}

/** The claim's volume once it is bound and exported. */
export async function volumeTarget(lab: E2eLab, ns: string, claim: string): Promise<VolumeTarget> {
  const ref = await partitionOf(lab, ns, claim);
  const parts = new ResourceClient(lab.conn, kinds.NVMePartition);
  const p = await until(`partition of ${ns}/${claim} exported`, async () => {
    const x = await parts.get(ref.name, ref.namespace);
    return x?.status?.state === "Exported" && x.status.nqn && x.status.backendPath ? x : undefined;
  });
  const node = lab.storage.find((s) => s.name === p.spec.nodeName);
  const kernel = lab.kernelStorage.find((s) => s.name === p.spec.nodeName);
  if (!node && !kernel)
    throw new Error(`partition ${ref.name} is on ${p.spec.nodeName}, which is no storage node of the lab`);
  return {
    partition: p,
    nqn: p.status?.nqn as string,
    bdev: p.status?.backendPath as string,
    storageNode: p.spec.nodeName as string,
    backend: node ? "spdk" : "kernel",
    spdkSocket: node?.spdkSocket ?? "",
    nvmetDir: kernel?.nvmetDir ?? "",
    attachmentName: attachmentNameFor(p.metadata.name, p.metadata.uid as string),
  };
}

/** The partition's NVMeVolumeAttachment, or undefined when there is none. */
export function readAttachment(lab: E2eLab, t: VolumeTarget): Promise<NVMeVolumeAttachment | undefined> {
  return new ResourceClient(lab.conn, kinds.NVMeVolumeAttachment).get(
    t.attachmentName,
    t.partition.metadata.namespace,
  );
}

/** The subsystem's allowed host NQNs, sorted. */
export async function allowedHosts(rpc: SpdkMethods, nqn: string): Promise<string[]> {
  const [s] = await rpc.nvmfGetSubsystems(nqn);
  return (s?.hosts ?? []).map((h) => h.nqn).sort();
}

/**
 * The allowed host NQNs of the volume's subsystem as its target has them, sorted: nvmf_get_subsystems
 * on SPDK, the allowed_hosts links in nvmet's configfs on the kernel backend.
 */
export async function targetAllowedHosts(t: VolumeTarget): Promise<string[]> {
  if (t.backend === "kernel") {
    try {
      return (await readdir(join(t.nvmetDir, "subsystems", t.nqn, "allowed_hosts"))).sort();
    } catch (err) {
      if ((err as { code?: string }).code === "ENOENT") return [];
      throw err;
    }
  }
  const { rpc, close } = targetRpc(t.spdkSocket);
  try {
    return await allowedHosts(rpc, t.nqn);
  } finally {
    await close();
  }
}

/**
 * Whether `host` is revoked on the volume's target: out of its ACL and, on nvmet, holding no
 * controller any more. SPDK's remove_host disconnects at once; nvmet checks hosts only at connect,
 * so the agent ends a revoked host's controllers by bouncing the ports after the ACL unlink, and
 * the revoke is complete once debugfs (<subnqn>/ctrl<id>/hostnqn) lists none of them.
 */
export async function targetRevoked(t: VolumeTarget, host: string): Promise<boolean> {
  if ((await targetAllowedHosts(t)).includes(host)) return false;
  if (t.backend !== "kernel") return true;
  const dir = join(t.nvmetDir, "..", "..", "debug", "nvmet", t.nqn);
  let ctrls: string[];
  try {
    ctrls = (await readdir(dir)).filter((e) => e.startsWith("ctrl"));
  } catch (err) {
    if ((err as { code?: string }).code === "ENOENT") return true;
    throw err;
  }
  for (const c of ctrls) {
    const owner = await readFile(join(dir, c, "hostnqn"), "utf8").catch(() => "");
    if (owner.trim() === host) return false;
  }
  return true;
}

/**
 * The host NQN a consumer node's plugin reports in its CSI node ID, as kubelet stored it in the
 * node's CSINode (what ControllerPublishVolume admits to the target ACL).
 */
export async function hostNqnOf(lab: E2eLab, node: string): Promise<string> {
  return until(`host NQN of ${node}`, async () => {
    const n = await lab.storageApi.readCSINode({ name: node }).catch(() => undefined);
    const id = n?.spec.drivers.find((d) => d.name === DRIVER_NAME)?.nodeID;
    return id ? parseNodeId(id).hostNQN : undefined;
  });
}

/** Size in bytes of a bdev on the target. */
export async function bdevBytes(rpc: SpdkMethods, name: string): Promise<number> {
  const [b] = await rpc.bdevGetBdevs({ name });
  if (!b) throw new Error(`bdev ${name} not found`);
  return b.num_blocks * b.block_size;
}

/** One observed state of an allowed-hosts list. */
export interface HostsSample {
  atMs: number;
  hosts: string[];
}

/**
 * Polls a subsystem's allowed hosts every few milliseconds and keeps every distinct state in
 * order, so a test can check which change came first and what was never allowed together. A state
 * that lasts less than one poll can slip between two samples, so this complements, not replaces,
 * the agent's own revoke-before-grant ordering.
 */
export class HostsRecorder {
  readonly samples: HostsSample[] = [];
  /** RPC errors while polling (e.g. the subsystem briefly gone); polling goes on. */
  readonly errors: string[] = [];
  #running = true;
  readonly #done: Promise<void>;
  readonly #close: () => Promise<void>;
  #stopped: Promise<void> | undefined;

  constructor(socketPath: string, nqn: string) {
    const { rpc, close } = targetRpc(socketPath);
    this.#close = close;
    this.#done = (async () => {
      while (this.#running) {
        try {
          const hosts = await allowedHosts(rpc, nqn);
          const last = this.samples.at(-1);
          if (!last || last.hosts.join(",") !== hosts.join(","))
            this.samples.push({ atMs: Date.now(), hosts });
          // A poll interval, not a wait for anything: keeps the emulator responsive to the agent.
          await Bun.sleep(5);
        } catch (err) {
          this.errors.push(String(err));
          await Bun.sleep(50);
        }
      }
    })();
  }

  /** The distinct host lists seen so far, oldest first. */
  states(): string[][] {
    return this.samples.map((s) => s.hosts);
  }

  /** Idempotent. */
  stop(): Promise<void> {
    this.#running = false;
    this.#stopped ??= this.#done.then(() => this.#close());
    return this.#stopped;
  }
}

/** Events of `involvedObject` kind/name in `ns` (core/v1 and what the kube components record). */
export async function eventsFor(
  lab: E2eLab,
  ns: string,
  kind: string,
  name: string,
): Promise<k8s.CoreV1Event[]> {
  const list = await lab.core.listNamespacedEvent({
    namespace: ns,
    fieldSelector: `involvedObject.kind=${kind},involvedObject.name=${name}`,
  });
  return list.items;
}
