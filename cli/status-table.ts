// The pure half of `distort status`: turns lists of DISTORT objects into one StatusReport (the
// `-o json` document), plain kubectl-style tables and the exit code. No I/O and no clock of its
// own: the caller passes `now`, so the same input always renders the same text.
import type { Condition } from "../api/common.ts";
import type { NVMeDevice } from "../api/nvme-device.ts";
import type { NVMeDeviceClaim } from "../api/nvme-device-claim.ts";
import type { NVMePartition } from "../api/nvme-partition.ts";
import type { NVMeSnapshot } from "../api/nvme-snapshot.ts";
import type { NVMeVolumeAttachment } from "../api/nvme-volume-attachment.ts";
import type { RDMAStorageNode } from "../api/rdma-storage-node.ts";
import { formatBytes } from "../lib/units.ts";

/** Everything `distort status` reads from the API server, already parsed with the kinds' schemas. */
export interface StatusInput {
  readonly storageNodes: readonly RDMAStorageNode[];
  readonly devices: readonly NVMeDevice[];
  readonly claims: readonly NVMeDeviceClaim[];
  readonly partitions: readonly NVMePartition[];
  readonly attachments: readonly NVMeVolumeAttachment[];
  readonly snapshots: readonly NVMeSnapshot[];
  /** Objects the server returned that do not match their kind's schema; listed as unhealthy. */
  readonly invalid?: readonly InvalidObject[];
}

/** An object that failed schema validation, kept so one bad object cannot hide the rest. */
export interface InvalidObject {
  readonly kind: string;
  readonly namespace: string | null;
  readonly name: string;
  readonly message: string;
}

/** What buildReport needs besides the objects; `now` is passed in so the report is reproducible. */
export interface ReportOptions {
  readonly now: Date;
  /** The namespace listed, or null for all namespaces (-A). */
  readonly namespace: string | null;
  /** Heartbeat age beyond which a storage node counts as stale; defaults to DEFAULT_STALENESS_MS. */
  readonly stalenessMs?: number;
}

/**
 * The manager's default staleness window (manager/config.ts, DISTORT_HEARTBEAT_STALENESS_MS). The
 * manager's own verdict (Ready=False, reason HeartbeatStale) is authoritative; this window only
 * lets the status flag a silent node while no manager is expiring heartbeats.
 */
export const DEFAULT_STALENESS_MS = 90_000;

const PARTITION_PHASES = ["Pending", "Placed", "Provisioning", "Exported", "Deleting", "Failed"] as const;
const DEVICE_PHASES = ["Available", "Claimed", "Unavailable"] as const;

/** One RDMAStorageNode as the STORAGE NODES table and the JSON `storageNodes` show it. */
export interface StorageNodeRow {
  readonly namespace: string | null;
  readonly name: string;
  readonly nodeName: string;
  /** Status of the Ready condition; null when the agent never wrote it. */
  readonly ready: string | null;
  readonly inventoryReady: string | null;
  readonly lastHeartbeatTime: string | null;
  readonly heartbeatFresh: boolean;
  readonly rdmaIP: string | null;
  readonly transport: string | null;
  /** Backends holding this node's listed devices (their status.activeBackend), sorted. */
  readonly backends: string[];
  readonly devices: number;
  readonly totalBytes: number | null;
  readonly freeBytes: number | null;
  readonly exportCount: number | null;
  readonly creationTimestamp: string | null;
}

/** One NVMeDevice as the DEVICES table and the JSON `devices` show it; bytes are raw integers. */
export interface DeviceRow {
  readonly name: string;
  readonly node: string;
  readonly serial: string;
  readonly model: string;
  readonly pciAddress: string;
  readonly numaNode: number;
  readonly allocatableBytes: number;
  /** Sum of the placement ledger (status.reservations). */
  readonly reservedBytes: number;
  /** The manager's status.freeBytes; null until the manager has accounted the device. */
  readonly freeBytes: number | null;
  readonly phase: string | null;
  readonly activeBackend: string | null;
  /** "namespace/name" of the owning NVMeDeviceClaim. */
  readonly claim: string | null;
  /** Ledger entries: partitions placed, or being placed, on the device. */
  readonly partitions: number;
  /** "Type=Status" of every unhealthy condition; empty when healthy. */
  readonly problems: string[];
  readonly creationTimestamp: string | null;
}

/** One NVMePartition as the PARTITIONS table and the JSON `partitions` show it. */
export interface PartitionRow {
  readonly namespace: string | null;
  readonly name: string;
  readonly sizeBytes: number;
  readonly allocatedBytes: number | null;
  readonly node: string | null;
  readonly deviceSerial: string | null;
  readonly backend: string;
  readonly volumeManager: string;
  /** status.state; "Pending" while nothing has acted on the partition yet. */
  readonly phase: string;
  readonly nqn: string | null;
  /** "transport://ip:port" initiators connect to; null until exported. */
  readonly portal: string | null;
  /** Nodes (spec.nodeId) of the attachments that record this exact partition. */
  readonly attachedTo: string[];
  readonly volumeHandle: string | null;
  readonly externalId: string | null;
  readonly deleting: boolean;
  readonly creationTimestamp: string | null;
}

/**
 * Derived from AccessReady and the attachment lifetimes, since the kind has no phase field:
 * Ready (the ACL admits exactly spec.hostNQN), Pending (the agent has not acted), NotReady
 * (AccessReady=False), TakingOver (the agent still enforces an older lifetime: the previous
 * host is being fenced), Revoking (deleted; the finalizer stays until the host is revoked).
 */
export type AttachmentPhase = "Ready" | "Pending" | "NotReady" | "TakingOver" | "Revoking";

/** One NVMeVolumeAttachment as the ATTACHMENTS table and the JSON `attachments` show it. */
export interface AttachmentRow {
  readonly namespace: string | null;
  readonly name: string;
  readonly partition: string;
  readonly node: string;
  readonly hostNQN: string;
  readonly attachmentId: string;
  readonly observedAttachmentId: string | null;
  readonly phase: AttachmentPhase;
  readonly reason: string | null;
  readonly creationTimestamp: string | null;
}

/** One NVMeSnapshot as the SNAPSHOTS table and the JSON `snapshots` show it. */
export interface SnapshotRow {
  readonly namespace: string | null;
  readonly name: string;
  readonly source: string;
  readonly readyToUse: boolean | null;
  readonly sizeBytes: number | null;
  readonly node: string | null;
  readonly deviceSerial: string | null;
  readonly externalId: string | null;
  readonly creationTimestamp: string | null;
}

/** One NVMeDeviceClaim as the CLAIMS table and the JSON `claims` show it. */
export interface ClaimRow {
  readonly namespace: string | null;
  readonly name: string;
  readonly serial: string;
  readonly node: string | null;
  readonly phase: string | null;
  readonly device: string | null;
  readonly creationTimestamp: string | null;
}

/** One finding of the health rule (see below): an UNHEALTHY table row. */
export interface UnhealthyRow {
  readonly kind: string;
  readonly namespace: string | null;
  readonly name: string;
  /** Condition type, or a pseudo type (Heartbeat, Schema) for findings no condition carries. */
  readonly type: string;
  readonly status: string;
  readonly reason: string;
  readonly message: string;
  /** lastTransitionTime of the condition (or the last heartbeat); null when unknown. */
  readonly since: string | null;
}

/** The counts and byte sums behind the TOTAL line; phase maps always hold every known phase. */
export interface StatusTotals {
  readonly devices: number;
  readonly devicesByPhase: Record<string, number>;
  /** Allocatable bytes of every listed device, whatever its phase. */
  readonly allocatableBytes: number;
  /** Allocatable bytes of Claimed devices: the only capacity placement may use. */
  readonly claimedBytes: number;
  /** Free bytes of Claimed devices (freeBytes, or allocatable minus the ledger until accounted). */
  readonly freeBytes: number;
  readonly partitions: number;
  readonly partitionsByPhase: Record<string, number>;
  readonly attachments: number;
  readonly snapshots: number;
  readonly unhealthy: number;
}

/** The whole status, as `-o json` prints it: keys always present (null when unknown), rows sorted. */
export interface StatusReport {
  readonly kind: "DistortStatus";
  readonly generatedAt: string;
  readonly namespace: string | null;
  /** False exactly when `unhealthy` is non-empty; the exit code follows it. */
  readonly healthy: boolean;
  readonly totals: StatusTotals;
  readonly storageNodes: StorageNodeRow[];
  readonly devices: DeviceRow[];
  readonly claims: ClaimRow[];
  readonly partitions: PartitionRow[];
  readonly attachments: AttachmentRow[];
  readonly snapshots: SnapshotRow[];
  readonly unhealthy: UnhealthyRow[];
}

// ---------------------------------------------------------------------------------------------
// Health rule.
//
// A condition is unhealthy when its status is the opposite of its healthy polarity:
//   - True is healthy for the types DISTORT writes with positive polarity: Ready (RDMAStorageNode,
//     NVMePartition, NVMeSnapshot), NVMeInventoryReady, KernelInventoryReady, SpdkInventoryReady,
//     StorageNodeReady and Present (NVMeDevice), Scheduled (NVMePartition), Bound and Released
//     (NVMeDeviceClaim), AccessReady (NVMeVolumeAttachment).
//   - False is healthy for the abnormal-true types: Overcommitted (NVMeDevice) and DeletionBlocked
//     (NVMeSnapshot). A type this code does not know is abnormal-true when its name says trouble
//     (Degraded, Blocked, Overcommitted, Failed, Failure, Error, Stale, Pressure, Unavailable,
//     Lost, Conflict as a suffix), and positive otherwise, as the Kubernetes API conventions prefer.
//   - Unknown is never unhealthy: the agent writes Ready=Unknown while it is still provisioning.
//   - A condition at its healthy status whose reason ends in Failed, Failure or Error is unhealthy
//     all the same, so a writer that reports a failure without flipping the status is not missed.
// Two findings carry no condition and are reported under pseudo types: a storage node whose
// heartbeat is missing or older than the staleness window while Ready is not already False
// (Heartbeat), and an object that does not match its kind's schema (Schema).
// ---------------------------------------------------------------------------------------------

const ABNORMAL_TRUE_TYPES: ReadonlySet<string> = new Set([
  "Overcommitted",
  "DeletionBlocked",
  "SpaceExhausted",
]);
const TROUBLE_SUFFIX =
  /(Degraded|Blocked|Overcommitted|Failed|Failure|Error|Stale|Pressure|Unavailable|Lost|Conflict)$/;
const FAILURE_REASON = /(Failed|Failure|Error)$/;

/** "True" for types where True means healthy, "False" for abnormal-true types (see the rule above). */
export function healthyStatus(type: string): "True" | "False" {
  const local = type.slice(type.lastIndexOf("/") + 1);
  return ABNORMAL_TRUE_TYPES.has(local) || TROUBLE_SUFFIX.test(local) ? "False" : "True";
}

/** True when `c` breaks the health rule documented above. */
export function isUnhealthyCondition(c: Pick<Condition, "type" | "status" | "reason">): boolean {
  if (c.status === "Unknown") return false;
  if (c.status !== healthyStatus(c.type)) return true;
  return FAILURE_REASON.test(c.reason);
}

/** 0 when nothing is unhealthy, 1 when the UNHEALTHY table has rows. */
export function exitCodeFor(report: Pick<StatusReport, "unhealthy">): 0 | 1 {
  return report.unhealthy.length === 0 ? 0 : 1;
}

// ---------------------------------------------------------------------------------------------
// Building the report.
// ---------------------------------------------------------------------------------------------

type Meta = { name: string; namespace?: string; creationTimestamp?: string };

function qualified(m: { name: string; namespace?: string | null }): string {
  return m.namespace ? `${m.namespace}/${m.name}` : m.name;
}

function byKey<T>(key: (t: T) => string): (a: T, b: T) => number {
  return (a, b) => {
    const ka = key(a);
    const kb = key(b);
    return ka < kb ? -1 : ka > kb ? 1 : 0;
  };
}

function conditionStatus(conds: readonly Condition[] | undefined, type: string): string | null {
  return conds?.find((c) => c.type === type)?.status ?? null;
}

function heartbeatFresh(n: RDMAStorageNode, nowMs: number, stalenessMs: number): boolean {
  const t = n.status?.lastHeartbeatTime;
  const ms = t === undefined ? Number.NaN : Date.parse(t);
  // A heartbeat from the future (clock skew) counts as fresh, as the manager treats it.
  return !Number.isNaN(ms) && nowMs <= ms + stalenessMs;
}

/**
 * The devices that belong in a one-namespace view. NVMeDevice is cluster-scoped, so a namespace
 * selects the devices its objects involve: claimed by a claim there, holding a reservation for a
 * partition there, or on a node whose RDMAStorageNode lives there (so unclaimed drives of that
 * namespace's storage nodes still show). With namespace null every device is listed.
 */
export function devicesInScope(
  devices: readonly NVMeDevice[],
  namespace: string | null,
  storageNodes: readonly RDMAStorageNode[],
): NVMeDevice[] {
  if (namespace === null) return [...devices];
  const nodes = new Set(
    storageNodes.filter((n) => n.metadata.namespace === namespace).map((n) => n.spec.nodeName),
  );
  return devices.filter(
    (d) =>
      nodes.has(d.spec.nodeName) ||
      d.status?.claimRef?.namespace === namespace ||
      (d.status?.reservations ?? []).some((r) => r.namespace === namespace),
  );
}

function unhealthyOf(kind: string, meta: Meta, conds: readonly Condition[] | undefined): UnhealthyRow[] {
  return (conds ?? []).filter(isUnhealthyCondition).map((c) => ({
    kind,
    namespace: meta.namespace ?? null,
    name: meta.name,
    type: c.type,
    status: c.status,
    reason: c.reason,
    message: c.message,
    since: c.lastTransitionTime,
  }));
}

function attachmentPhase(a: NVMeVolumeAttachment): { phase: AttachmentPhase; reason: string | null } {
  const access = a.status?.conditions?.find((c) => c.type === "AccessReady");
  const observed = a.status?.observedAttachmentId;
  if (a.metadata.deletionTimestamp) return { phase: "Revoking", reason: access?.reason ?? null };
  if (observed !== undefined && observed !== a.spec.attachmentId) {
    return { phase: "TakingOver", reason: access?.reason ?? null };
  }
  if (access?.status === "True" && observed === a.spec.attachmentId) return { phase: "Ready", reason: null };
  if (access?.status === "False") return { phase: "NotReady", reason: access.reason };
  return { phase: "Pending", reason: access?.reason ?? null };
}

function portalOf(p: NVMePartition): string | null {
  const s = p.status;
  if (!s?.portalIP) return null;
  const host = s.portalIP.includes(":") ? `[${s.portalIP}]` : s.portalIP;
  const transport = s.transport ?? p.spec.targetOptions?.transport ?? "rdma";
  return `${transport}://${host}${s.portalPort === undefined ? "" : `:${s.portalPort}`}`;
}

function counts(keys: readonly string[], values: readonly string[]): Record<string, number> {
  // Known keys always present, in lifecycle order, so scripts can index them without guards.
  const out: Record<string, number> = Object.fromEntries(keys.map((k) => [k, 0]));
  for (const v of values) out[v] = (out[v] ?? 0) + 1;
  return out;
}

/** Builds the report from what was listed. Pure; `now` decides heartbeat freshness only. */
export function buildReport(input: StatusInput, opts: ReportOptions): StatusReport {
  const nowMs = opts.now.getTime();
  const stalenessMs = opts.stalenessMs ?? DEFAULT_STALENESS_MS;
  const devices = devicesInScope(input.devices, opts.namespace, input.storageNodes);
  const unhealthy: UnhealthyRow[] = [];

  const storageNodes = input.storageNodes.map((n): StorageNodeRow => {
    const conds = n.status?.conditions;
    const onNode = devices.filter((d) => d.spec.nodeName === n.spec.nodeName);
    const fresh = heartbeatFresh(n, nowMs, stalenessMs);
    const ready = conditionStatus(conds, "Ready");
    unhealthy.push(...unhealthyOf("RDMAStorageNode", n.metadata, conds));
    if (!fresh && ready !== "False") {
      const hb = n.status?.lastHeartbeatTime ?? null;
      unhealthy.push({
        kind: "RDMAStorageNode",
        namespace: n.metadata.namespace ?? null,
        name: n.metadata.name,
        type: "Heartbeat",
        status: "Stale",
        reason: hb === null ? "NoHeartbeat" : "HeartbeatStale",
        message:
          hb === null
            ? `the agent of node ${n.spec.nodeName} has never reported a heartbeat`
            : `no heartbeat since ${hb} (staleness window ${Math.round(stalenessMs / 1000)} s); Ready is not yet False`,
        since: hb,
      });
    }
    return {
      namespace: n.metadata.namespace ?? null,
      name: n.metadata.name,
      nodeName: n.spec.nodeName,
      ready,
      inventoryReady: conditionStatus(conds, "NVMeInventoryReady"),
      lastHeartbeatTime: n.status?.lastHeartbeatTime ?? null,
      heartbeatFresh: fresh,
      rdmaIP: n.status?.rdmaIP ?? null,
      transport: n.status?.transport ?? null,
      backends: [
        ...new Set(onNode.flatMap((d) => (d.status?.activeBackend ? [d.status.activeBackend] : []))),
      ].sort(),
      devices: onNode.length,
      totalBytes: n.status?.totalBytes ?? null,
      freeBytes: n.status?.freeBytes ?? null,
      exportCount: n.status?.exportCount ?? null,
      creationTimestamp: n.metadata.creationTimestamp ?? null,
    };
  });

  const deviceRows = devices.map((d): DeviceRow => {
    const conds = d.status?.conditions;
    const ledger = d.status?.reservations ?? [];
    unhealthy.push(...unhealthyOf("NVMeDevice", d.metadata, conds));
    const claim = d.status?.claimRef;
    return {
      name: d.metadata.name,
      node: d.spec.nodeName,
      serial: d.spec.serial,
      model: d.spec.model,
      pciAddress: d.spec.pciAddress,
      numaNode: d.spec.numaNode,
      allocatableBytes: d.spec.allocatableBytes,
      reservedBytes: ledger.reduce((sum, r) => sum + r.bytes, 0),
      freeBytes: d.status?.freeBytes ?? null,
      phase: d.status?.phase ?? null,
      activeBackend: d.status?.activeBackend ?? null,
      claim: claim ? `${claim.namespace}/${claim.name}` : null,
      partitions: ledger.length,
      problems: (conds ?? []).filter(isUnhealthyCondition).map((c) => `${c.type}=${c.status}`),
      creationTimestamp: d.metadata.creationTimestamp ?? null,
    };
  });

  const claims = input.claims.map((c): ClaimRow => {
    unhealthy.push(...unhealthyOf("NVMeDeviceClaim", c.metadata, c.status?.conditions));
    return {
      namespace: c.metadata.namespace ?? null,
      name: c.metadata.name,
      serial: c.spec.serial,
      node: c.status?.nodeName ?? c.spec.nodeName ?? null,
      phase: c.status?.phase ?? null,
      device: c.status?.deviceName ?? null,
      creationTimestamp: c.metadata.creationTimestamp ?? null,
    };
  });

  const partitions = input.partitions.map((p): PartitionRow => {
    unhealthy.push(...unhealthyOf("NVMePartition", p.metadata, p.status?.conditions));
    // The UID pins the exact incarnation; an attachment of a deleted same-named partition is not this one's.
    const attachedTo = input.attachments
      .filter((a) =>
        p.metadata.uid
          ? a.spec.partitionUID === p.metadata.uid
          : a.spec.partitionName === p.metadata.name && a.metadata.namespace === p.metadata.namespace,
      )
      .map((a) => a.spec.nodeId)
      .sort();
    return {
      namespace: p.metadata.namespace ?? null,
      name: p.metadata.name,
      sizeBytes: p.spec.sizeBytes,
      allocatedBytes: p.status?.allocatedBytes ?? null,
      node: p.spec.nodeName ?? null,
      deviceSerial: p.spec.deviceSerial ?? null,
      backend: p.spec.backend,
      volumeManager: p.spec.volumeManager,
      phase: p.status?.state ?? "Pending",
      nqn: p.status?.nqn ?? null,
      portal: portalOf(p),
      attachedTo,
      volumeHandle: p.status?.volumeHandle ?? null,
      externalId: p.status?.externalId ?? null,
      deleting: p.metadata.deletionTimestamp !== undefined,
      creationTimestamp: p.metadata.creationTimestamp ?? null,
    };
  });

  const attachments = input.attachments.map((a): AttachmentRow => {
    unhealthy.push(...unhealthyOf("NVMeVolumeAttachment", a.metadata, a.status?.conditions));
    const { phase, reason } = attachmentPhase(a);
    return {
      namespace: a.metadata.namespace ?? null,
      name: a.metadata.name,
      partition: a.spec.partitionName,
      node: a.spec.nodeId,
      hostNQN: a.spec.hostNQN,
      attachmentId: a.spec.attachmentId,
      observedAttachmentId: a.status?.observedAttachmentId ?? null,
      phase,
      reason,
      creationTimestamp: a.metadata.creationTimestamp ?? null,
    };
  });

  const snapshots = input.snapshots.map((s): SnapshotRow => {
    unhealthy.push(...unhealthyOf("NVMeSnapshot", s.metadata, s.status?.conditions));
    return {
      namespace: s.metadata.namespace ?? null,
      name: s.metadata.name,
      source: s.spec.sourcePartitionName,
      readyToUse: s.status?.readyToUse ?? null,
      sizeBytes: s.status?.sizeBytes ?? null,
      node: s.status?.nodeName ?? null,
      deviceSerial: s.status?.deviceSerial ?? null,
      externalId: s.status?.externalId ?? null,
      creationTimestamp: s.metadata.creationTimestamp ?? null,
    };
  });

  for (const bad of input.invalid ?? []) {
    unhealthy.push({
      kind: bad.kind,
      namespace: bad.namespace,
      name: bad.name,
      type: "Schema",
      status: "Invalid",
      reason: "SchemaMismatch",
      message: bad.message,
      since: null,
    });
  }

  const claimed = deviceRows.filter((d) => d.phase === "Claimed");
  const totals: StatusTotals = {
    devices: deviceRows.length,
    devicesByPhase: counts(
      DEVICE_PHASES,
      deviceRows.map((d) => d.phase ?? "Unknown"),
    ),
    allocatableBytes: deviceRows.reduce((s, d) => s + d.allocatableBytes, 0),
    claimedBytes: claimed.reduce((s, d) => s + d.allocatableBytes, 0),
    freeBytes: claimed.reduce(
      (s, d) => s + (d.freeBytes ?? Math.max(0, d.allocatableBytes - d.reservedBytes)),
      0,
    ),
    partitions: partitions.length,
    partitionsByPhase: counts(
      PARTITION_PHASES,
      partitions.map((p) => p.phase),
    ),
    attachments: attachments.length,
    snapshots: snapshots.length,
    unhealthy: unhealthy.length,
  };

  const kindOrder = [
    "RDMAStorageNode",
    "NVMeDevice",
    "NVMeDeviceClaim",
    "NVMePartition",
    "NVMeVolumeAttachment",
    "NVMeSnapshot",
  ];
  const kindRank = (k: string) => {
    const i = kindOrder.indexOf(k);
    return String(i < 0 ? kindOrder.length : i).padStart(2, "0");
  };
  const nsName = (r: { namespace: string | null; name: string }) => qualified(r);
  return {
    kind: "DistortStatus",
    generatedAt: opts.now.toISOString(),
    namespace: opts.namespace,
    healthy: unhealthy.length === 0,
    totals,
    storageNodes: storageNodes.sort(byKey(nsName)),
    devices: deviceRows.sort(byKey((d) => `${d.node}\u0000${d.serial}`)),
    claims: claims.sort(byKey(nsName)),
    partitions: partitions.sort(byKey(nsName)),
    attachments: attachments.sort(byKey(nsName)),
    snapshots: snapshots.sort(byKey(nsName)),
    unhealthy: unhealthy.sort(
      byKey((u) => `${kindRank(u.kind)}\u0000${u.kind}\u0000${nsName(u)}\u0000${u.type}`),
    ),
  };
}

// ---------------------------------------------------------------------------------------------
// Rendering.
// ---------------------------------------------------------------------------------------------

const GiB = 1024 ** 3;

/**
 * Bytes as GiB with one decimal ("100.0GiB"), one unit so a column compares at a glance. Sizes
 * under 0.1 GiB would print as 0.0, so they keep their own unit ("4MiB"). No space inside, so
 * `awk` sees one field per cell. null prints "-".
 */
export function formatSize(bytes: number | null): string {
  if (bytes === null) return "-";
  if (bytes !== 0 && Math.abs(bytes) < 0.1 * GiB) return formatBytes(bytes).replace(" ", "");
  return `${(bytes / GiB).toFixed(1)}GiB`;
}

/**
 * Time since `iso`, the way kubectl prints an AGE (kubectl's HumanDuration): "45s", "3m20s",
 * "5h", "12d". "-" when `iso` is null or unparsable; "0s" for a time in the future.
 */
export function formatAge(iso: string | null, now: Date): string {
  if (iso === null) return "-";
  const t = Date.parse(iso);
  if (Number.isNaN(t)) return "-";
  const s = Math.max(0, Math.floor((now.getTime() - t) / 1000));
  if (s < 120) return `${s}s`;
  const m = Math.floor(s / 60);
  if (m < 10) return s % 60 === 0 ? `${m}m` : `${m}m${s % 60}s`;
  if (m < 180) return `${m}m`;
  const h = Math.floor(m / 60);
  if (h < 8) return m % 60 === 0 ? `${h}h` : `${h}h${m % 60}m`;
  if (h < 48) return `${h}h`;
  const d = Math.floor(h / 24);
  if (h < 24 * 8) return h % 24 === 0 ? `${d}d` : `${d}d${h % 24}h`;
  if (d < 365 * 2) return `${d}d`;
  const y = Math.floor(d / 365);
  if (d < 365 * 8) return d % 365 === 0 ? `${y}y` : `${y}y${d % 365}d`;
  return `${y}y`;
}

// Object fields and condition messages are written by other programs: control characters (a
// newline, an escape sequence) would break the alignment or drive the terminal.
// biome-ignore lint/suspicious/noControlCharactersInRegex: matching control characters is the point.
const CONTROL = /[\u0000-\u001f\u007f-\u009f]/g;

function cell(value: string | number | null | undefined, max = Number.POSITIVE_INFINITY): string {
  if (value === null || value === undefined || value === "") return "-";
  const s = String(value).replace(/\s+/g, " ").replace(CONTROL, "?").trim();
  if (s === "") return "-";
  return s.length > max ? `${s.slice(0, max - 3)}...` : s;
}

/**
 * Left-aligned columns separated by three spaces, as kubectl prints them; no trailing blanks.
 * Cells are printed as given (callers sanitize with `cell`).
 */
export function formatTable(headers: readonly string[], rows: readonly (readonly string[])[]): string {
  const widths = headers.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? "").length)));
  const line = (r: readonly string[]) =>
    r
      .map((c, i) => c.padEnd(widths[i] ?? 0))
      .join("   ")
      .trimEnd();
  return [line(headers), ...rows.map(line)].join("\n");
}

/** How renderTables prints; the report itself is the same either way. */
export interface RenderOptions {
  /** Extra columns (addresses, NQNs, ids), and condition messages printed in full. */
  readonly wide?: boolean;
}

function section(title: string, headers: string[], rows: string[][]): string {
  return `${title}\n${rows.length === 0 ? "(none)" : formatTable(headers, rows)}`;
}

function yesNo(b: boolean | null): string {
  return b === null ? "-" : b ? "yes" : "no";
}

function phaseCounts(byPhase: Record<string, number>): string {
  const parts = Object.entries(byPhase)
    .filter(([, n]) => n > 0)
    .map(([phase, n]) => `${n} ${phase}`);
  return parts.length === 0 ? "" : ` (${parts.join(", ")})`;
}

function plural(n: number, word: string): string {
  return `${n} ${word}${n === 1 ? "" : "s"}`;
}

/** The one-line summary under the tables. */
export function formatTotals(t: StatusTotals): string {
  return (
    `TOTAL: ${plural(t.devices, "device")}${phaseCounts(t.devicesByPhase)}, ` +
    `${formatSize(t.claimedBytes)} claimed, ${formatSize(t.freeBytes)} free; ` +
    `${plural(t.partitions, "partition")}${phaseCounts(t.partitionsByPhase)}; ` +
    `${plural(t.attachments, "attachment")}; ${t.unhealthy} unhealthy`
  );
}

/**
 * Every section as plain text: STORAGE NODES, DEVICES, CLAIMS and SNAPSHOTS (only when there are
 * any), PARTITIONS, ATTACHMENTS, UNHEALTHY, then the totals line. Ends with a newline.
 */
export function renderTables(report: StatusReport, opts: RenderOptions = {}): string {
  const wide = opts.wide ?? false;
  const now = new Date(report.generatedAt);
  const age = (t: string | null) => formatAge(t, now);
  const out: string[] = [];

  out.push(
    section(
      "STORAGE NODES",
      [
        "NAME",
        "NODE",
        "READY",
        "FRESH",
        "HEARTBEAT",
        "BACKENDS",
        "DEVICES",
        ...(wide ? ["INVENTORY", "RDMA-IP", "TRANSPORT", "EXPORTS", "FREE", "AGE"] : []),
      ],
      report.storageNodes.map((n) => [
        cell(qualified(n)),
        cell(n.nodeName),
        cell(n.ready),
        yesNo(n.heartbeatFresh),
        n.lastHeartbeatTime === null ? "never" : age(n.lastHeartbeatTime),
        cell(n.backends.join(",")),
        String(n.devices),
        ...(wide
          ? [
              cell(n.inventoryReady),
              cell(n.rdmaIP),
              cell(n.transport),
              cell(n.exportCount),
              formatSize(n.freeBytes),
              age(n.creationTimestamp),
            ]
          : []),
      ]),
    ),
  );

  out.push(
    section(
      "DEVICES",
      [
        "NODE",
        "SERIAL",
        "MODEL",
        "ALLOCATABLE",
        "RESERVED",
        "FREE",
        "PHASE",
        "CLAIM",
        "PARTITIONS",
        "HEALTH",
        ...(wide ? ["NAME", "PCI", "NUMA", "BACKEND", "AGE"] : []),
      ],
      report.devices.map((d) => [
        cell(d.node),
        cell(d.serial),
        cell(d.model, wide ? undefined : 32),
        formatSize(d.allocatableBytes),
        formatSize(d.reservedBytes),
        formatSize(d.freeBytes),
        cell(d.phase),
        cell(d.claim),
        String(d.partitions),
        d.problems.length === 0 ? "ok" : cell(d.problems.join(",")),
        ...(wide
          ? [
              cell(d.name),
              cell(d.pciAddress),
              String(d.numaNode),
              cell(d.activeBackend),
              age(d.creationTimestamp),
            ]
          : []),
      ]),
    ),
  );

  if (report.claims.length > 0) {
    out.push(
      section(
        "CLAIMS",
        ["NAME", "SERIAL", "NODE", "PHASE", "DEVICE", "AGE"],
        report.claims.map((c) => [
          cell(qualified(c)),
          cell(c.serial),
          cell(c.node),
          cell(c.phase),
          cell(c.device),
          age(c.creationTimestamp),
        ]),
      ),
    );
  }

  out.push(
    section(
      "PARTITIONS",
      [
        "NAME",
        "SIZE",
        "NODE",
        "DEVICE",
        "BACKEND",
        "PHASE",
        "EXPORT",
        "ATTACHED-TO",
        "VOLUME",
        "AGE",
        ...(wide ? ["NQN", "ALLOCATED", "MANAGER", "EXTERNAL-ID"] : []),
      ],
      report.partitions.map((p) => [
        cell(qualified(p)),
        formatSize(p.sizeBytes),
        cell(p.node),
        cell(p.deviceSerial),
        cell(p.backend),
        cell(p.deleting && p.phase !== "Deleting" ? `${p.phase}(deleting)` : p.phase),
        cell(p.portal ?? p.nqn),
        cell(p.attachedTo.join(",")),
        cell(p.volumeHandle ?? p.externalId),
        age(p.creationTimestamp),
        ...(wide
          ? [cell(p.nqn), formatSize(p.allocatedBytes), cell(p.volumeManager), cell(p.externalId)]
          : []),
      ]),
    ),
  );

  out.push(
    section(
      "ATTACHMENTS",
      [
        "NAME",
        "PARTITION",
        "NODE",
        "PHASE",
        "REASON",
        "AGE",
        ...(wide ? ["HOST-NQN", "ATTACHMENT-ID", "OBSERVED-ID"] : []),
      ],
      report.attachments.map((a) => [
        cell(qualified(a)),
        cell(a.partition),
        cell(a.node),
        a.phase,
        cell(a.reason),
        age(a.creationTimestamp),
        ...(wide ? [cell(a.hostNQN), cell(a.attachmentId), cell(a.observedAttachmentId)] : []),
      ]),
    ),
  );

  if (report.snapshots.length > 0) {
    out.push(
      section(
        "SNAPSHOTS",
        ["NAME", "SOURCE", "READY", "SIZE", "NODE", "AGE", ...(wide ? ["DEVICE", "EXTERNAL-ID"] : [])],
        report.snapshots.map((s) => [
          cell(qualified(s)),
          cell(s.source),
          yesNo(s.readyToUse),
          formatSize(s.sizeBytes),
          cell(s.node),
          age(s.creationTimestamp),
          ...(wide ? [cell(s.deviceSerial), cell(s.externalId)] : []),
        ]),
      ),
    );
  }

  out.push(
    section(
      "UNHEALTHY",
      ["KIND", "NAME", "CONDITION", "REASON", "SINCE", "MESSAGE"],
      report.unhealthy.map((u) => [
        u.kind,
        cell(qualified(u)),
        cell(`${u.type}=${u.status}`),
        cell(u.reason),
        age(u.since),
        cell(u.message, wide ? undefined : 80),
      ]),
    ),
  );

  out.push(formatTotals(report.totals));
  return `${out.join("\n\n")}\n`;
}

/** The report as one JSON document (two-space indent, trailing newline) for scripts. */
export function renderJson(report: StatusReport): string {
  return `${JSON.stringify(report, null, 2)}\n`;
}
