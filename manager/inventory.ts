// The manager's in-memory picture of the cluster: the watch caches' objects indexed the ways the
// reconcilers look them up (devices by serial, node and claim; partitions by device; ledger holders
// by partition UID), plus newer device versions from its own reads and writes. Single-threaded.
import type { NVMeDevice, NVMeDeviceClaim, NVMePartition, RDMAStorageNode } from "../api/index.ts";
import {
  type DeviceUsage,
  devicePlacementKey,
  deviceUsage,
  ledgerOf,
  type PartitionUse,
  partitionPlacementKey,
  partitionUse,
} from "../lib/device-ledger.ts";
import { objectKey } from "../lib/kube/resource.ts";
import { pickNode } from "./node-health.ts";
import { claimKeyOf } from "./ownership.ts";
import type { PlacementView } from "./placement/placement-core.ts";

function addTo<K, V>(m: Map<K, Set<V>>, k: K, v: V): void {
  let s = m.get(k);
  if (!s) {
    s = new Set();
    m.set(k, s);
  }
  s.add(v);
}

function removeFrom<K, V>(m: Map<K, Set<V>>, k: K, v: V): void {
  const s = m.get(k);
  if (!s) return;
  s.delete(v);
  if (s.size === 0) m.delete(k);
}

/**
 * Orders two resourceVersions when both are decimal (etcd revisions, as every current apiserver
 * serves them); undefined when they cannot be compared. Only used to prefer the newer of two
 * copies for choosing; correctness never depends on it (writes are resourceVersion-guarded).
 */
export function compareResourceVersions(a: string | undefined, b: string | undefined): number | undefined {
  if (!a || !b || !/^\d+$/.test(a) || !/^\d+$/.test(b)) return undefined;
  const x = BigInt(a);
  const y = BigInt(b);
  return x < y ? -1 : x > y ? 1 : 0;
}

/** Index over the four cached kinds. Every method is O(1) or O(result) unless noted. */
export class Inventory implements PlacementView {
  readonly #devices = new Map<string, NVMeDevice>();
  readonly #written = new Map<string, NVMeDevice>();
  readonly #claims = new Map<string, NVMeDeviceClaim>();
  readonly #nodes = new Map<string, RDMAStorageNode>();
  readonly #partitions = new Map<string, NVMePartition>();

  readonly #devicesBySerial = new Map<string, Set<string>>();
  readonly #devicesByNode = new Map<string, Set<string>>();
  readonly #deviceByPlacement = new Map<string, string>();
  readonly #claimsBySerial = new Map<string, Set<string>>();
  /** "ns/name" of the claim a device's status names -> device names. */
  readonly #devicesByClaimKey = new Map<string, Set<string>>();
  readonly #nodesByNodeName = new Map<string, Set<string>>();
  /** placement key -> partition uid -> use, for placed partitions. */
  readonly #assigned = new Map<string, Map<string, PartitionUse & { key: string }>>();
  readonly #assignedVersion = new Map<string, number>();
  /** partition uid -> devices whose ledger holds it. */
  readonly #ledgerHolders = new Map<string, Set<string>>();
  readonly #usageMemo = new Map<string, { rv: string | undefined; ver: number; usage: DeviceUsage }>();
  /** Reservations this process has decided on and not yet stored: device -> uid -> use. */
  readonly #assumed = new Map<string, Map<string, PartitionUse>>();
  /** Keys of partitions that are unplaced and not deleting. */
  readonly #pending = new Set<string>();
  /** Replicated volume UID -> keys of its replica partitions (spec.replicaOf.uid). */
  readonly #replicas = new Map<string, Set<string>>();
  /** Keys of replicated volumes (spec.replicas > 1). */
  readonly #replicated = new Set<string>();

  // --- feeding (cache handlers) ---

  setDevice(d: NVMeDevice): void {
    const name = d.metadata.name;
    const old = this.#devices.get(name);
    if (old) this.#unindexDevice(old);
    this.#devices.set(name, d);
    const w = this.#written.get(name);
    if (w && (compareResourceVersions(w.metadata.resourceVersion, d.metadata.resourceVersion) ?? 0) <= 0) {
      this.#written.delete(name);
    }
    addTo(this.#devicesBySerial, d.spec.serial, name);
    addTo(this.#devicesByNode, d.spec.nodeName, name);
    this.#deviceByPlacement.set(devicePlacementKey(d), name);
    for (const r of ledgerOf(this.latestDevice(name) ?? d)) addTo(this.#ledgerHolders, r.uid, name);
    const ck = claimKeyOf(this.latestDevice(name) ?? d);
    if (ck) addTo(this.#devicesByClaimKey, ck, name);
  }

  deleteDevice(d: NVMeDevice): void {
    const name = d.metadata.name;
    const old = this.#devices.get(name);
    if (old) this.#unindexDevice(old);
    this.#devices.delete(name);
    this.#written.delete(name);
    this.#usageMemo.delete(name);
  }

  /**
   * Records a device object this process just read from or wrote to the API server, so choices
   * made before the watch delivers it already see it. Ignored unless newer than the cached copy.
   */
  noteFreshDevice(d: NVMeDevice): void {
    const name = d.metadata.name;
    const cached = this.#devices.get(name);
    if (!cached) return;
    const cmp = compareResourceVersions(d.metadata.resourceVersion, cached.metadata.resourceVersion);
    if (cmp === undefined || cmp <= 0) return;
    const prev = this.latestDevice(name);
    if (prev) this.#unindexLatest(name, prev);
    this.#written.set(name, d);
    for (const r of ledgerOf(d)) addTo(this.#ledgerHolders, r.uid, name);
    const ck = claimKeyOf(d);
    if (ck) addTo(this.#devicesByClaimKey, ck, name);
  }

  #unindexDevice(d: NVMeDevice): void {
    const name = d.metadata.name;
    removeFrom(this.#devicesBySerial, d.spec.serial, name);
    removeFrom(this.#devicesByNode, d.spec.nodeName, name);
    const pk = devicePlacementKey(d);
    if (this.#deviceByPlacement.get(pk) === name) this.#deviceByPlacement.delete(pk);
    const latest = this.latestDevice(name) ?? d;
    this.#unindexLatest(name, latest);
    if (latest !== d) this.#unindexLatest(name, d);
  }

  #unindexLatest(name: string, d: NVMeDevice): void {
    for (const r of ledgerOf(d)) removeFrom(this.#ledgerHolders, r.uid, name);
    const ck = claimKeyOf(d);
    if (ck) removeFrom(this.#devicesByClaimKey, ck, name);
  }

  setClaim(c: NVMeDeviceClaim): void {
    const key = objectKey(c.metadata);
    const old = this.#claims.get(key);
    if (old) removeFrom(this.#claimsBySerial, old.spec.serial, key);
    this.#claims.set(key, c);
    addTo(this.#claimsBySerial, c.spec.serial, key);
  }

  deleteClaim(c: NVMeDeviceClaim): void {
    const key = objectKey(c.metadata);
    const old = this.#claims.get(key);
    if (old) removeFrom(this.#claimsBySerial, old.spec.serial, key);
    this.#claims.delete(key);
  }

  setNode(n: RDMAStorageNode): void {
    const key = objectKey(n.metadata);
    const old = this.#nodes.get(key);
    if (old) removeFrom(this.#nodesByNodeName, old.spec.nodeName, key);
    this.#nodes.set(key, n);
    addTo(this.#nodesByNodeName, n.spec.nodeName, key);
  }

  deleteNode(n: RDMAStorageNode): void {
    const key = objectKey(n.metadata);
    const old = this.#nodes.get(key);
    if (old) removeFrom(this.#nodesByNodeName, old.spec.nodeName, key);
    this.#nodes.delete(key);
  }

  setPartition(p: NVMePartition): void {
    const key = objectKey(p.metadata);
    const old = this.#partitions.get(key);
    if (old) this.#unindexPartition(key, old);
    this.#partitions.set(key, p);
    const pk = partitionPlacementKey(p);
    const use = partitionUse(p);
    if (pk && use) {
      let m = this.#assigned.get(pk);
      if (!m) {
        m = new Map();
        this.#assigned.set(pk, m);
      }
      m.set(use.uid, { ...use, key });
      this.#bump(pk);
    }
    const replicated = (p.spec.replicas ?? 1) > 1;
    if (!pk && !p.metadata.deletionTimestamp && !replicated) this.#pending.add(key);
    if (replicated) this.#replicated.add(key);
    const of = p.spec.replicaOf?.uid;
    if (of) {
      let keys = this.#replicas.get(of);
      if (!keys) {
        keys = new Set();
        this.#replicas.set(of, keys);
      }
      keys.add(key);
    }
  }

  deletePartition(p: NVMePartition): void {
    const key = objectKey(p.metadata);
    const old = this.#partitions.get(key);
    if (old) this.#unindexPartition(key, old);
    this.#partitions.delete(key);
  }

  #unindexPartition(key: string, p: NVMePartition): void {
    this.#pending.delete(key);
    this.#replicated.delete(key);
    const of = p.spec.replicaOf?.uid;
    if (of) removeFrom(this.#replicas, of, key);
    const pk = partitionPlacementKey(p);
    const uid = p.metadata.uid;
    if (!pk || !uid) return;
    const m = this.#assigned.get(pk);
    if (m?.delete(uid)) {
      if (m.size === 0) this.#assigned.delete(pk);
      this.#bump(pk);
    }
  }

  #bump(pk: string): void {
    this.#assignedVersion.set(pk, (this.#assignedVersion.get(pk) ?? 0) + 1);
  }

  // --- reading ---

  /** The newest known version of a device: this process's last write or the cache's copy. */
  latestDevice(name: string): NVMeDevice | undefined {
    return this.#written.get(name) ?? this.#devices.get(name);
  }

  /** Every device, newest known versions. O(devices). */
  *devices(): Iterable<NVMeDevice> {
    for (const name of this.#devices.keys()) yield this.latestDevice(name) as NVMeDevice;
  }

  deviceCount(): number {
    return this.#devices.size;
  }

  devicesWithSerial(serial: string): NVMeDevice[] {
    return [...(this.#devicesBySerial.get(serial) ?? [])].map((n) => this.latestDevice(n) as NVMeDevice);
  }

  devicesOnNode(nodeName: string): NVMeDevice[] {
    return [...(this.#devicesByNode.get(nodeName) ?? [])].map((n) => this.latestDevice(n) as NVMeDevice);
  }

  /** The device a placed partition points at (by node and serial). */
  deviceFor(nodeName: string, serial: string): string | undefined {
    return this.#deviceByPlacement.get(`${nodeName}\u0000${serial}`);
  }

  /** Devices whose status.claimRef names claim "ns/name" (any UID). */
  devicesClaimedAs(claimKey: string): NVMeDevice[] {
    return [...(this.#devicesByClaimKey.get(claimKey) ?? [])].map((n) => this.latestDevice(n) as NVMeDevice);
  }

  /** Devices whose ledger (as last seen) holds partition `uid`. */
  devicesHolding(uid: string): string[] {
    return [...(this.#ledgerHolders.get(uid) ?? [])];
  }

  claim(key: string): NVMeDeviceClaim | undefined {
    return this.#claims.get(key);
  }

  claimsWithSerial(serial: string): NVMeDeviceClaim[] {
    return [...(this.#claimsBySerial.get(serial) ?? [])].map((k) => this.#claims.get(k) as NVMeDeviceClaim);
  }

  node(nodeName: string): RDMAStorageNode | undefined {
    const keys = this.#nodesByNodeName.get(nodeName);
    if (!keys) return undefined;
    return pickNode([...keys].map((k) => this.#nodes.get(k) as RDMAStorageNode));
  }

  /** All RDMAStorageNode objects describing `nodeName`. */
  nodesNamed(nodeName: string): RDMAStorageNode[] {
    return [...(this.#nodesByNodeName.get(nodeName) ?? [])].map((k) => this.#nodes.get(k) as RDMAStorageNode);
  }

  partition(key: string): NVMePartition | undefined {
    return this.#partitions.get(key);
  }

  /** The replica partitions of the replicated volume with UID `uid` (spec.replicaOf.uid). */
  /** Every partition the cache holds (the drain controller counts what is left on a node). */
  allPartitions(): IterableIterator<NVMePartition> {
    return this.#partitions.values();
  }

  replicasOf(uid: string): NVMePartition[] {
    return [...(this.#replicas.get(uid) ?? [])].map((k) => this.#partitions.get(k) as NVMePartition);
  }

  /** Keys of every replicated volume (spec.replicas > 1). */
  replicatedKeys(): string[] {
    return [...this.#replicated];
  }

  /** Placed partitions pointing at `device` (terminating ones included). */
  assigned(device: NVMeDevice): (PartitionUse & { key: string })[] {
    return [...(this.#assigned.get(devicePlacementKey(device))?.values() ?? [])];
  }

  /**
   * Ledger plus placed partitions plus reservations this process is storing right now (so
   * concurrent workers spread over devices instead of queueing on the most free one); memoised
   * per device version and assignment change.
   */
  usage(device: NVMeDevice): DeviceUsage {
    const name = device.metadata.name;
    const pk = devicePlacementKey(device);
    const ver = this.#assignedVersion.get(pk) ?? 0;
    const rv = device.metadata.resourceVersion;
    const memo = this.#usageMemo.get(name);
    if (memo && memo.ver === ver && memo.rv === rv && rv !== undefined) return memo.usage;
    const assumed = this.#assumed.get(name);
    const usage = deviceUsage(device, this.#assigned.get(pk)?.values() ?? [], assumed?.values());
    this.#usageMemo.set(name, { rv, ver, usage });
    return usage;
  }

  /**
   * Counts `use` against `device` in usage() until the returned function is called: a decision
   * in flight, not yet in the ledger. Purely local; the ledger write decides for real.
   */
  assume(device: string, use: PartitionUse): () => void {
    let m = this.#assumed.get(device);
    if (!m) {
      m = new Map();
      this.#assumed.set(device, m);
    }
    m.set(use.uid, use);
    this.#usageMemo.delete(device);
    return () => {
      const cur = this.#assumed.get(device);
      if (cur?.get(use.uid) !== use) return;
      cur.delete(use.uid);
      if (cur.size === 0) this.#assumed.delete(device);
      this.#usageMemo.delete(device);
    };
  }

  /** Number of partitions waiting for placement (unplaced, not deleting). */
  get pendingCount(): number {
    return this.#pending.size;
  }
}
