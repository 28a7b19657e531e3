// `kubectl distort describe volume PVC`: the chain behind one claim, PVC -> PV -> NVMePartition ->
// NVMeDevice -> storage node -> subsystem -> hosts and attachments, each link with its
// conditions, and what is wrong along it. Reading (fetchVolumeChain) is apart from the pure
// assembly and rendering (buildVolumeChain, renderVolumeChain), which tests feed plain objects.
import { kinds } from "../api/kinds.ts";
import type { NVMeDevice } from "../api/nvme-device.ts";
import type { NVMePartition } from "../api/nvme-partition.ts";
import type { NVMeVolumeAttachment } from "../api/nvme-volume-attachment.ts";
import type { RDMAStorageNode } from "../api/rdma-storage-node.ts";
import { FENCED_ANNOTATION } from "../csi/controller/fencing.ts";
import { parseVolumeId } from "../csi/controller/volume-id.ts";
import type { Condition } from "../lib/kube/conditions.ts";
import type { KubeConnection } from "../lib/kube/connection.ts";
import { ResourceClient } from "../lib/kube/resource.ts";
import { formatBytes } from "../lib/units.ts";
import { DRIVER_NAME } from "../lib/volume-context.ts";
import { getJson, listJson } from "./cluster.ts";
import { NotFoundError, UsageError } from "./exit-codes.ts";
import { describeFailure } from "./status.ts";
import { isUnhealthyCondition } from "./status-table.ts";

/** A built-in object as the API server returns it; only the fields read here are typed. */
export interface RawObject {
  metadata: { name: string; namespace?: string; uid?: string; annotations?: Record<string, string> };
  spec?: Record<string, unknown>;
  status?: Record<string, unknown> & { conditions?: Condition[] };
}

/** Everything read for one claim; absent links are undefined. */
export interface VolumeChainInput {
  pvc: RawObject;
  pv?: RawObject;
  partition?: NVMePartition;
  device?: NVMeDevice;
  storageNode?: RDMAStorageNode;
  node?: RawObject;
  attachments: NVMeVolumeAttachment[];
  volumeAttachments: RawObject[];
}

/** One link of the chain: what it is, its facts in display order, and its conditions. */
export interface ChainLink {
  kind: string;
  namespace: string | null;
  name: string;
  fields: Record<string, string | number | boolean | null>;
  conditions: Condition[];
}

/** What `-o json|yaml` prints; `problems` empty exactly when `healthy`. */
export interface VolumeChain {
  kind: "DistortVolume";
  claim: string;
  healthy: boolean;
  links: ChainLink[];
  subsystem: {
    nqn: string | null;
    transport: string | null;
    portal: string | null;
    hosts: { hostNQN: string; node: string; attachment: string; enforced: boolean }[];
  } | null;
  problems: string[];
}

const str = (v: unknown): string | null => (typeof v === "string" && v !== "" ? v : null);

function conditionProblems(link: ChainLink): string[] {
  return link.conditions
    .filter(isUnhealthyCondition)
    .map(
      (c) =>
        `${link.kind} ${link.name}: ${c.type}=${c.status} ${c.reason}${c.message ? `: ${c.message}` : ""}`,
    );
}

/** Assembles the chain and its problems from what was read. Pure. */
export function buildVolumeChain(input: VolumeChainInput): VolumeChain {
  const problems: string[] = [];
  const links: ChainLink[] = [];
  const { pvc, pv, partition, device, storageNode, node } = input;
  const claim = `${pvc.metadata.namespace}/${pvc.metadata.name}`;
  const pvcSpec = pvc.spec ?? {};
  const capacity = (pvc.status?.capacity as Record<string, string> | undefined)?.storage ?? null;
  links.push({
    kind: "PersistentVolumeClaim",
    namespace: pvc.metadata.namespace ?? null,
    name: pvc.metadata.name,
    fields: {
      phase: str(pvc.status?.phase),
      capacity,
      storageClass: str(pvcSpec.storageClassName),
      volumeMode: str(pvcSpec.volumeMode) ?? "Filesystem",
      volume: str(pvcSpec.volumeName),
    },
    conditions: pvc.status?.conditions ?? [],
  });
  if (!str(pvcSpec.volumeName))
    problems.push(
      `claim ${claim} is not bound to a volume yet (phase ${str(pvc.status?.phase) ?? "unknown"})`,
    );
  let handle: string | null = null;
  if (pv) {
    const csi = (pv.spec?.csi ?? {}) as Record<string, unknown>;
    handle = str(csi.volumeHandle);
    links.push({
      kind: "PersistentVolume",
      namespace: null,
      name: pv.metadata.name,
      fields: {
        phase: str(pv.status?.phase),
        driver: str(csi.driver),
        volumeHandle: handle,
        reclaimPolicy: str(pv.spec?.persistentVolumeReclaimPolicy),
      },
      conditions: [],
    });
    if (str(csi.driver) !== DRIVER_NAME) {
      problems.push(
        `volume ${pv.metadata.name} is not a DISTORT volume (driver ${str(csi.driver) ?? "none"})`,
      );
      handle = null;
    }
  } else if (str(pvcSpec.volumeName)) {
    problems.push(`PersistentVolume ${pvcSpec.volumeName} does not exist`);
  }
  const ref = handle ? parseVolumeId(handle) : undefined;
  if (handle && !ref) problems.push(`volume handle ${handle} is not one DISTORT issues`);
  if (ref && !partition) problems.push(`NVMePartition ${ref.namespace}/${ref.name} does not exist`);
  if (ref && partition && partition.metadata.uid !== ref.uid) {
    problems.push(
      `NVMePartition ${ref.namespace}/${ref.name} has uid ${partition.metadata.uid}, the volume handle names ${ref.uid}: it was recreated`,
    );
  }
  if (partition) {
    const s = partition.status;
    const link: ChainLink = {
      kind: "NVMePartition",
      namespace: partition.metadata.namespace ?? null,
      name: partition.metadata.name,
      fields: {
        state: s?.state ?? null,
        size: formatBytes(partition.spec.sizeBytes),
        allocated: s?.allocatedBytes === undefined ? null : formatBytes(s.allocatedBytes),
        backend: partition.spec.backend,
        volumeManager: partition.spec.volumeManager,
        node: partition.spec.nodeName ?? null,
        device: partition.spec.deviceSerial ?? null,
        uid: partition.metadata.uid ?? null,
        ...((partition.spec.replicas ?? 1) > 1
          ? {
              copies: partition.spec.replicas ?? null,
              dataGeneration: s?.dataGeneration ?? null,
              // One line: every copy with its node, state and generation.
              replicas:
                (s?.replicas ?? [])
                  .map((r) => `${r.name}@${r.nodeName ?? "-"}:${r.state}/g${r.generation}`)
                  .join(" ") || null,
              // The cluster rebuild slot the serving node asked for or holds (status.rebuildSlot).
              rebuildSlot: s?.rebuildSlot
                ? `${s.rebuildSlot.replica} for ${s.rebuildSlot.node}: ${s.rebuildSlot.grantedAt ? `granted ${s.rebuildSlot.grantedAt}` : `queued since ${s.rebuildSlot.requestedAt}${s.rebuildSlot.message ? ` (${s.rebuildSlot.message})` : ""}`}`
                : null,
            }
          : {}),
      },
      conditions: s?.conditions ?? [],
    };
    links.push(link);
    problems.push(...conditionProblems(link));
    for (const r of s?.replicas ?? []) {
      if (r.state !== "Online" && r.state !== "Pending")
        problems.push(
          `copy ${r.name} on ${r.nodeName ?? "no node"} is ${r.state} at generation ${r.generation} of ${s?.dataGeneration ?? "-"}${r.message ? `: ${r.message}` : ""}`,
        );
    }
    if (!partition.spec.nodeName)
      problems.push(`NVMePartition ${partition.metadata.name} is not placed on a node yet`);
  }
  if (device) {
    const link: ChainLink = {
      kind: "NVMeDevice",
      namespace: null,
      name: device.metadata.name,
      fields: {
        serial: device.spec.serial,
        model: device.spec.model ?? null,
        node: device.spec.nodeName,
        phase: device.status?.phase ?? null,
        backend: device.status?.activeBackend ?? null,
        allocatable: formatBytes(device.spec.allocatableBytes),
        free: device.status?.freeBytes === undefined ? null : formatBytes(device.status.freeBytes),
      },
      conditions: device.status?.conditions ?? [],
    };
    links.push(link);
    problems.push(...conditionProblems(link));
  } else if (partition?.spec.deviceSerial) {
    problems.push(
      `no NVMeDevice with serial ${partition.spec.deviceSerial} on node ${partition.spec.nodeName}`,
    );
  }
  if (storageNode) {
    const s = storageNode.status;
    const link: ChainLink = {
      kind: "RDMAStorageNode",
      namespace: storageNode.metadata.namespace ?? null,
      name: storageNode.metadata.name,
      fields: {
        node: storageNode.spec.nodeName,
        rdmaIP: s?.rdmaIP ?? null,
        listener: s?.transport ?? null,
        served: s?.servedTransports || null,
        exports: s?.exportCount ?? null,
        spdkVersion: s?.spdkVersion ?? null,
        heartbeat: s?.lastHeartbeatTime ?? null,
      },
      conditions: s?.conditions ?? [],
    };
    links.push(link);
    problems.push(...conditionProblems(link));
  } else if (partition?.spec.nodeName) {
    problems.push(`no RDMAStorageNode for node ${partition.spec.nodeName}: its agent has not reported`);
  }
  if (node) {
    const ready = (node.status?.conditions ?? []).filter((c) => c.type === "Ready");
    const link: ChainLink = {
      kind: "Node",
      namespace: null,
      name: node.metadata.name,
      fields: {},
      conditions: ready,
    };
    links.push(link);
    problems.push(...conditionProblems(link));
  }
  const mine = partition
    ? input.attachments.filter((a) => a.spec.partitionUID === partition.metadata.uid)
    : [];
  for (const a of mine) {
    const fenced = a.metadata.annotations?.[FENCED_ANNOTATION] === "true";
    const link: ChainLink = {
      kind: "NVMeVolumeAttachment",
      namespace: a.metadata.namespace ?? null,
      name: a.metadata.name,
      fields: {
        node: a.spec.nodeId,
        hostNQN: a.spec.hostNQN,
        attachmentId: a.spec.attachmentId,
        enforced: a.status?.observedAttachmentId === a.spec.attachmentId,
        fenced,
      },
      conditions: a.status?.conditions ?? [],
    };
    links.push(link);
    problems.push(...conditionProblems(link));
    if (fenced)
      problems.push(
        `NVMeVolumeAttachment ${a.metadata.name}: node ${a.spec.nodeId} is fenced; the next publish on another node takes the volume over`,
      );
  }
  for (const va of input.volumeAttachments) {
    const attached = va.status?.attached === true;
    const err = (va.status?.attachError as { message?: string } | undefined)?.message ?? null;
    links.push({
      kind: "VolumeAttachment",
      namespace: null,
      name: va.metadata.name,
      fields: { node: str(va.spec?.nodeName), attached, attachError: err },
      conditions: [],
    });
    if (err) problems.push(`VolumeAttachment ${va.metadata.name}: ${err}`);
  }
  const s = partition?.status;
  const subsystem = partition
    ? {
        nqn: s?.nqn ?? null,
        transport: s?.transport ?? null,
        portal: s?.portalIP ? `${s.portalIP}:${s.portalPort ?? 4420}` : null,
        hosts: mine.map((a) => ({
          hostNQN: a.spec.hostNQN,
          node: a.spec.nodeId,
          attachment: a.metadata.name,
          enforced:
            a.status?.observedAttachmentId === a.spec.attachmentId &&
            (a.status?.conditions ?? []).some((c) => c.type === "AccessReady" && c.status === "True"),
        })),
      }
    : null;
  return { kind: "DistortVolume", claim, healthy: problems.length === 0, links, subsystem, problems };
}

function fieldText(fields: ChainLink["fields"]): string {
  return Object.entries(fields)
    .filter(([, v]) => v !== null && v !== "")
    .map(([k, v]) => `${k}=${v}`)
    .join("  ");
}

/** The chain as indented text: one block per link, its conditions, the subsystem, then problems. Pure. */
export function renderVolumeChain(chain: VolumeChain): string {
  const out: string[] = [];
  for (const l of chain.links) {
    out.push(`${l.kind} ${l.namespace ? `${l.namespace}/` : ""}${l.name}`);
    const f = fieldText(l.fields);
    if (f) out.push(`  ${f}`);
    for (const c of l.conditions) {
      const mark = isUnhealthyCondition(c) ? "!" : " ";
      out.push(`  ${mark} ${c.type}=${c.status} ${c.reason}${c.message ? `: ${c.message}` : ""}`);
    }
    if (l.kind === "RDMAStorageNode" && chain.subsystem) {
      const sub = chain.subsystem;
      out.push(`Subsystem ${sub.nqn ?? "(not exported)"}`);
      const where = [sub.transport, sub.portal].filter(Boolean).join(" ");
      if (where) out.push(`  ${where}`);
      if (sub.hosts.length === 0) out.push("  hosts: none (no node has the volume published)");
      for (const h of sub.hosts) {
        out.push(
          `  host ${h.hostNQN}  node=${h.node}  ${h.enforced ? "admitted" : "not yet admitted"} (${h.attachment})`,
        );
      }
    }
  }
  out.push("");
  if (chain.problems.length === 0) out.push("No problems found.");
  else {
    out.push("Problems:");
    for (const p of chain.problems) out.push(`  - ${p}`);
  }
  return `${out.join("\n")}\n`;
}

/**
 * Reads the chain of claim `namespace/name`. Throws NotFoundError when the PVC does not exist,
 * UsageError (exit 2) when the API server cannot be read. Missing later links are not errors:
 * buildVolumeChain reports them.
 */
export async function fetchVolumeChain(
  conn: KubeConnection,
  namespace: string,
  name: string,
): Promise<VolumeChainInput> {
  const pvc = await getJson<RawObject>(
    conn,
    `/api/v1/namespaces/${encodeURIComponent(namespace)}/persistentvolumeclaims/${encodeURIComponent(name)}`,
    `get PersistentVolumeClaim ${namespace}/${name}`,
  );
  if (!pvc) throw new NotFoundError(`PersistentVolumeClaim ${namespace}/${name} not found`);
  const input: VolumeChainInput = { pvc, attachments: [], volumeAttachments: [] };
  const pvName = str(pvc.spec?.volumeName);
  if (!pvName) return input;
  input.pv = await getJson<RawObject>(
    conn,
    `/api/v1/persistentvolumes/${encodeURIComponent(pvName)}`,
    `get PersistentVolume ${pvName}`,
  );
  input.volumeAttachments = (
    await listJson<RawObject>(conn, "/apis/storage.k8s.io/v1/volumeattachments", "list VolumeAttachments")
  ).filter(
    (va) =>
      (va.spec?.source as { persistentVolumeName?: string } | undefined)?.persistentVolumeName === pvName,
  );
  const csi = (input.pv?.spec?.csi ?? {}) as { driver?: string; volumeHandle?: string };
  const ref = csi.driver === DRIVER_NAME && csi.volumeHandle ? parseVolumeId(csi.volumeHandle) : undefined;
  if (!ref) return input;
  const guard = async <T>(what: string, p: Promise<T>): Promise<T> => {
    try {
      return await p;
    } catch (err) {
      throw new UsageError(describeFailure(err, conn.server, what));
    }
  };
  const partition = await guard(
    "get NVMePartition",
    new ResourceClient(conn, kinds.NVMePartition).get(ref.name, ref.namespace),
  );
  if (!partition) return input;
  input.partition = partition;
  input.attachments = (
    await guard(
      "list NVMeVolumeAttachments",
      new ResourceClient(conn, kinds.NVMeVolumeAttachment).list({ namespace: ref.namespace }),
    )
  ).items;
  const nodeName = partition.spec.nodeName;
  if (nodeName) {
    const [devices, storageNodes, node] = await Promise.all([
      guard("list NVMeDevices", new ResourceClient(conn, kinds.NVMeDevice).list()),
      guard(
        "list RDMAStorageNodes",
        new ResourceClient(conn, kinds.RDMAStorageNode).list({ namespace: ref.namespace }),
      ),
      getJson<RawObject>(conn, `/api/v1/nodes/${encodeURIComponent(nodeName)}`, `get Node ${nodeName}`),
    ]);
    input.device = devices.items.find(
      (d) => d.spec.nodeName === nodeName && d.spec.serial === partition.spec.deviceSerial,
    );
    input.storageNode = storageNodes.items.find((n) => n.spec.nodeName === nodeName);
    if (node) input.node = node;
  }
  return input;
}
