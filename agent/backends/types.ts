// The two plug points of the agent (section 6.4 of the design): a VolumeManager carves capacity
// out of a claimed drive, a TargetBackend exports a carved volume over NVMe-oF and keeps its host
// ACL exact. Implementations: spdk (nvmf_tgt) + spdk-lvol, kernel (configfs nvmet) + parted.
// Every method is idempotent and safe to repeat after a crash at any point.

export type BackendName = "spdk" | "kernel";

/**
 * details.reason of a prepareDevice StorageError meaning the drive is not there for the backend
 * (missing, or not bound to its driver): nothing but an operator or a hotplug fixes it, so the
 * partition reports it as a condition and retries slowly instead of backing off as for a fault.
 */
export const DRIVE_MISSING = "DriveMissing";
export type VolumeManagerName = "spdk-lvol" | "parted";
export type Transport = "rdma" | "tcp";

/** One host's DH-HMAC-CHAP secrets (DHHC-1 form); ctrlSecret makes the exchange bidirectional. */
export interface HostKey {
  readonly secret: string;
  /** The controller's secret: the host checks the target with it. */
  readonly ctrlSecret?: string;
  /**
   * The exchange's HMAC hash and DH group, where the target keeps them per host (nvmet's
   * dhchap_hash, dhchap_dhgroup); SPDK negotiates from its target-wide lists instead.
   */
  readonly hash?: "sha256" | "sha384" | "sha512";
  readonly dhgroup?: "null" | "ffdhe2048" | "ffdhe3072" | "ffdhe4096" | "ffdhe6144" | "ffdhe8192";
}

/**
 * Host NQN -> its DH-HMAC-CHAP secret ("DHHC-1:<hash>:<base64>:") or secrets (HostKey). Never
 * logged.
 */
export type HostKeys = ReadonlyMap<string, string | HostKey>;

/** Host NQN -> its NVMe/TCP TLS PSK (interchange form, NVMeTLSkey-1:...) on a TLS export. Never logged. */
export type HostPsks = ReadonlyMap<string, string>;

/** The HostKey form of one HostKeys entry. */
export function hostKeyOf(v: string | HostKey): HostKey {
  return typeof v === "string" ? { secret: v } : v;
}

/** A claimed physical drive as the agent knows it; serial is the stable identity. */
export interface DeviceRef {
  /** NVMeDevice object name. */
  name: string;
  serial: string;
  pciAddress: string;
  /** Kernel block device of namespace 1 (e.g. /dev/nvme0n1), when the kernel owns the drive. */
  blockDevice?: string;
  /** SPDK bdev of namespace 1 (e.g. "nvme_1a2b3c4dn1"), once the SPDK backend attached the drive. */
  bdevName?: string;
}

/** What to carve: identity derived from the partition's immutable UID, never from its name. */
export interface VolumeSpec {
  /** "vol-<hash of UID>"; also names the lvol and the GPT partition. */
  externalId: string;
  sizeBytes: number;
  device: DeviceRef;
  /**
   * Initial content (spdk-lvol only): clone the snapshot lvol named `lvolName`, or snapshot the
   * partition lvol `lvolName` into a hidden snapshot and clone that. Both live in the same lvstore.
   */
  contentSource?: { kind: "snapshot" | "partition"; lvolName: string };
  /**
   * A thin lvol (spdk-lvol only; spec.thinProvisioning): clusters are allocated on first write.
   * Only a new volume is made thin or thick; an existing one keeps what it was created as.
   */
  thin?: boolean;
}

export interface Volume {
  externalId: string;
  /** What a target exports: an lvol bdev name (its UUID) or a partition device path. */
  backendPath: string;
  sizeBytes: number;
}

export interface VolumeManager {
  readonly name: VolumeManagerName;
  /** Creates the per-drive layout (lvstore, GPT label) if missing; keeps an existing one. */
  prepareLayout(device: DeviceRef): Promise<void>;
  /** The volume if it exists (looked up by externalId), else undefined. */
  findVolume(spec: VolumeSpec): Promise<Volume | undefined>;
  /** Finds or creates; never creates a second volume for the same externalId. */
  ensureVolume(spec: VolumeSpec): Promise<Volume>;
  /** Grows the volume to at least spec.sizeBytes; never shrinks. */
  resizeVolume?(spec: VolumeSpec): Promise<Volume>;
  /** Deletes; a volume that is already gone counts as deleted. */
  deleteVolume(spec: VolumeSpec): Promise<void>;
}

export interface ExportSpec {
  /** nqn.2026-02.io.distort:volume-<externalId> */
  nqn: string;
  volume: Volume;
  transport: Transport;
  /** Portal address (IPv4 or IPv6) and service port: the primary portal, which must listen. */
  address: string;
  port: number;
  /**
   * Further addresses of this node the export also listens on, with the same transport and port
   * (several paths to one subsystem, for NVMe multipath). Best effort: one that cannot listen is
   * left out, and `listening` says which did. A backend without multipath serves the primary only.
   */
  moreAddresses?: readonly string[];
  /** Subsystem serial number shown to initiators; derived from externalId. */
  serialNumber: string;
  /**
   * UUID of namespace 1, when it must not be the volume's own (a copy of a replicated volume:
   * see agent/nexus/identity.ts replicaNamespaceUuidFor). A namespace with another UUID is
   * replaced. Absent: the backend's default (SPDK: the bdev's UUID). Ignored by nvmet.
   */
  namespaceUuid?: string;
  /**
   * NVMe/TCP TLS 1.3 only (tcp): every listener takes TLS connections and nothing else, and hosts
   * are admitted with their PSK (setHosts' psks). A backend that cannot serve it refuses with
   * StorageError details.reason TLS_UNSUPPORTED and the reason in its message.
   */
  tls?: boolean;
  /**
   * The controller IDs this node's subsystem hands out, [min, max] (SPDK's min_cntlid and
   * max_cntlid; settable only when the subsystem is created). The nodes that may serve one
   * replicated volume each take a disjoint range, since a host refuses a second controller of a
   * subsystem whose ID repeats one it already has. Absent: the target's default (1-65519).
   */
  cntlidRange?: { min: number; max: number };
  /**
   * Keep every listener of the export at ANA optimized even with a single listener (a
   * replicated volume's serving node: its consumers also hold standby paths to other nodes,
   * which stay inaccessible). Absent: optimized is only kept once there is more than one
   * listener. Ignored by nvmet.
   */
  keepOptimized?: boolean;
}

/**
 * A standby export (spdk only): the subsystem of a replicated volume on a node that holds one of
 * its copies but does not serve it. Its consumers connect to it ahead of a failover; it lists no
 * namespace and every listener is ANA inaccessible, so no I/O reaches it until this node serves.
 */
export type StandbySpec = Omit<ExportSpec, "volume" | "namespaceUuid" | "keepOptimized">;

/** details.reason of the StorageError a backend refuses a TLS export with (the why in its message). */
export const TLS_UNSUPPORTED = "TLSUnsupported";

/** ANA state of a listener as NVMe defines it (SPDK reports it per ANA group). */
export type AnaState = "optimized" | "non_optimized" | "inaccessible" | "persistent_loss" | "change";

/** A listener an export really has, as the target reported it. */
export interface ListenerState {
  transport: Transport;
  address: string;
  port: number;
  /** The state of the export's ANA group (namespace 1's) on this listener, when the target reports ANA. */
  anaState?: AnaState;
}

/** What the target currently has for one NQN, component by component. */
export interface ExportState {
  nqn: string;
  /** Backing path of namespace 1, if present. */
  namespace?: string;
  listeners: { transport: Transport; address: string; port: number }[];
  /** Host NQNs allowed; never "any host". */
  hosts: string[];
  /**
   * Host NQNs holding a live controller of the subsystem, sorted, when the backend can see them
   * (nvmet with debugfs); absent when it cannot. A host here that is not in `hosts` has been
   * revoked but is not yet cut off.
   */
  connectedHosts?: string[];
}

/** I/O rate limits of one volume, SPDK's four (bdev_set_qos_limit); 0 is unlimited. */
export interface QosLimits {
  rwIosPerSec: number;
  rwMBytesPerSec: number;
  rMBytesPerSec: number;
  wMBytesPerSec: number;
}

/** No limit at all: what a volume without spec.qos gets, and what a fresh bdev has. */
export const UNLIMITED: QosLimits = { rwIosPerSec: 0, rwMBytesPerSec: 0, rMBytesPerSec: 0, wMBytesPerSec: 0 };

export interface TargetBackend {
  readonly name: BackendName;
  /** Makes the drive usable by this backend (driver binding, controller attach). Idempotent. */
  prepareDevice(device: DeviceRef): Promise<DeviceRef>;
  /** The export as it exists now, or undefined when there is no subsystem. */
  inspectExport(nqn: string): Promise<ExportState | undefined>;
  /**
   * Makes the export exactly `spec` (subsystem, namespace 1 backed by the volume, listener),
   * repairing whatever is missing or different. Host ACL is left to setHosts. Returns the names
   * of the components it had to create or repair (empty when it was already exact).
   */
  ensureExport(spec: ExportSpec): Promise<string[]>;
  /**
   * Makes `nqn` a standby export exactly as `spec` says (subsystem, listeners at ANA inaccessible,
   * then no namespace: a node that served it stops being reachable before its data goes).
   * Host ACL is left to setHosts. Returns what it created or changed. Absent on a backend
   * without ANA (nvmet serves no replicated volume).
   */
  ensureStandby?(spec: StandbySpec): Promise<string[]>;
  /**
   * Makes the subsystem's host ACL exactly `hostNQNs` (revoking others first) and cuts every
   * other host off: on return no other host can do I/O through an existing controller either
   * (SPDK's remove_host disconnects it; nvmet needs its ports bounced). Never any-host.
   * `keys` maps a host NQN to the DH-HMAC-CHAP secret (DHHC-1 form) it must authenticate with,
   * and the controller secret the target answers with when bidirectional; a host whose keys
   * changed is revoked and re-admitted with the new ones. `psks` (TLS exports) maps a host to the
   * PSK its TLS handshake must prove; a host whose PSK changed is re-admitted with the new one.
   */
  setHosts(nqn: string, hostNQNs: readonly string[], keys?: HostKeys, psks?: HostPsks): Promise<void>;
  /**
   * The listeners the last successful ensureExport(nqn) of this process found or made, read back
   * from the target (primary first, then the further portals in the order asked), or undefined when
   * none has run. No target call. Absent on a backend that serves the primary portal only, for
   * which a successful ensureExport means exactly that portal listens.
   */
  listening?(nqn: string): readonly ListenerState[] | undefined;
  /**
   * Makes the volume's rate limits exactly `limits` and returns what the target reports enforcing
   * afterwards, with `changed` when it had to set them (a fresh bdev after a target restart is
   * unlimited). Idempotent: limits already in force cost one read. Absent on a backend without
   * per-volume rate limits (nvmet).
   */
  applyQos?(volume: Volume, limits: QosLimits): Promise<{ applied: QosLimits; changed: boolean }>;
  /** Removes the export (hosts first, then listener, namespace, subsystem). Absent counts as done. */
  removeExport(nqn: string): Promise<void>;
  /**
   * Reads the state of every export at once, so that the passes over many exports that follow
   * (a verify sweep, the replay after a restart) are answered from that one read instead of one
   * read each. Changes nothing; a failure only means the passes read for themselves. Absent on a
   * backend whose reads are cheap (nvmet's configfs).
   */
  prefetch?(): Promise<void>;
}
