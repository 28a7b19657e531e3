// The spdk-lvol volume manager: one lvstore per drive (named from its serial) on the drive's
// namespace-1 bdev, one lvol per partition named by its externalId. Lookups go by the alias
// "<lvstore>/<externalId>" before anything is created, so a retry after a crash finds the lvol an
// earlier pass made instead of creating a second one. A volume with a content source is a clone of
// a snapshot in the same lvstore (for a partition source, of a hidden snapshot taken for it).
import { tmpdir } from "node:os";
import type { Mutex } from "../../../lib/concurrency/mutex.ts";
import { StorageError } from "../../../lib/errors.ts";
import { hostExec } from "../../../lib/exec.ts";
import type { Logger } from "../../../lib/log.ts";
import type { SpdkRpc } from "../../../lib/spdk/client.ts";
import type { SpdkMethods } from "../../../lib/spdk/methods.ts";
import type { SpdkReadCache } from "../../../lib/spdk/read-cache.ts";
import { TargetFacts } from "../../../lib/spdk/target-facts.ts";
import { ALLOCATION_UNIT } from "../../../lib/units.ts";
import type { DeviceRef, Volume, VolumeManager, VolumeSpec } from "../../backends/types.ts";
import { cloneSourceSnapshotFor, lvstoreNameFor } from "../../partitions/identity.ts";
import {
  blkidImageProbe,
  type ContentProbe,
  deallocateReadsZeros,
  edgeRegions,
  identifyNamespace,
  type NamespaceIdentity,
} from "./drive-probe.ts";

/** details.reason of the refusal to put an lvstore on a drive that holds something. */
export const DRIVE_NOT_BLANK = "DriveNotBlank";

/** SPDK's clear_method, for the lvstore's initial clear and for every lvol's freed clusters. */
export type ClearMethod = "unmap" | "write_zeroes";

/**
 * How freed clusters are cleared on this drive. Unmap (deallocate) leaves clusters reading as
 * zeros only when the namespace says deallocated blocks read as zeros (DLFEAT read value 001b)
 * and the drive supports deallocate at all; otherwise a thick lvol made later on those clusters
 * would read the previous tenant's bytes, so they are written with zeros (SPDK sends Write Zeroes,
 * or writes zeros itself where the drive has no such command).
 */
export function clearMethodFor(id: NamespaceIdentity, unmapSupported: boolean): ClearMethod {
  return unmapSupported && deallocateReadsZeros(id) ? "unmap" : "write_zeroes";
}

const MiB = 1024 * 1024;

export interface SpdkLvolOptions {
  methods: SpdkMethods;
  /** For calls without a typed wrapper (bdev_wait_for_examine). */
  rpc: SpdkRpc;
  logger: Logger;
  /**
   * Held by changed-block reads while they shallow-copy snapshots (SpdkBlockMaps); snapshot
   * deletion waits for it. SPDK removes the bdev of a snapshot being copied but refuses to delete
   * its blob (EBUSY), which would leave the blob behind with nothing naming it.
   */
  snapshotCopies?: Mutex;
  /** Facts verified on the current target, shared with the SPDK target backend. Default: own one. */
  facts?: TargetFacts;
  /** Classifies a drive's first and last MiB before its first lvstore. Default: blkid on the host. */
  probe?: ContentProbe;
  /**
   * The read cache `methods` calls through, if any: once an existing lvstore is found loaded on a
   * new target connection, it lists every bdev, so the passes that follow (a replay) find their
   * lvols in that listing instead of reading each.
   */
  reads?: SpdkReadCache;
}

function isKind(err: unknown, kind: string): boolean {
  return err instanceof StorageError && err.kind === kind;
}

export class SpdkLvolVolumeManager implements VolumeManager {
  readonly name = "spdk-lvol" as const;
  private readonly m: SpdkMethods;
  private readonly facts: TargetFacts;
  private readonly probe: ContentProbe;

  constructor(private readonly opts: SpdkLvolOptions) {
    this.m = opts.methods;
    this.facts = opts.facts ?? new TargetFacts({ rpc: opts.rpc });
    this.probe = opts.probe ?? blkidImageProbe(hostExec, tmpdir());
  }

  /** The drive's clear method (clearMethodFor), read once per drive and target incarnation. */
  private clearMethod(serial: string, bdevName: string): Promise<ClearMethod> {
    return this.facts.verified(`clear-method:${serial}:${bdevName}`, async () => {
      const [base] = await this.m.bdevGetBdevs({ name: bdevName });
      const id = await identifyNamespace(this.opts.rpc, bdevName);
      return clearMethodFor(id, base?.supported_io_types?.unmap === true);
    });
  }

  /**
   * Refuses a drive that holds anything blkid recognises in its first or last MiB (a partition
   * table, a filesystem, LVM, MD RAID, ZFS, Ceph...): it may be another tenant's or system's data,
   * and an lvstore would overwrite it. The operator wipes such a drive explicitly.
   */
  private async checkBlank(serial: string, bdevName: string): Promise<void> {
    const id = await identifyNamespace(this.opts.rpc, bdevName);
    const size = id.numBlocks * id.blockSize;
    const content = await this.probe.probe(size, await edgeRegions(this.opts.rpc, bdevName, id));
    if (content.kind === "blank") return;
    const holds = content.kind === "filesystem" ? `a filesystem (${content.fsType})` : content.description;
    throw new StorageError(
      "precondition",
      `drive ${serial} is not blank: it holds ${holds}. DISTORT puts its lvstore only on a blank drive; ` +
        "wipe it explicitly (e.g. wipefs --all and blkdiscard, before SPDK takes the drive) once its data is not needed",
      { details: { reason: DRIVE_NOT_BLANK, serial, holds } },
    );
  }

  /**
   * Creates the drive's lvstore unless it exists; refuses an lvstore of that name on another bdev.
   * Checked once per drive and target incarnation (TargetFacts).
   */
  async prepareLayout(device: DeviceRef): Promise<void> {
    const bdevName = device.bdevName;
    if (!bdevName) throw new StorageError("precondition", `drive ${device.serial} is not attached to SPDK`);
    await this.facts.verified(`lvstore:${device.serial}:${bdevName}`, async () => {
      const loaded = await this.ensureLvstore(device.serial, bdevName);
      const generation = this.opts.rpc.connectionGeneration;
      if (loaded && this.opts.reads && generation !== undefined && generation !== this.listedOn) {
        this.listedOn = generation;
        // Inside the check: the passes waiting for this lvstore wait for the listing too.
        await this.opts.reads.load({ timeoutMs: 5000 }).catch(() => {});
      }
    });
  }

  /** The connection generation the bdevs were last listed on after an lvstore was found loaded. */
  private listedOn: number | undefined;

  /** True when the lvstore already existed (loaded by examine), false when this call made it. */
  private async ensureLvstore(serial: string, bdevName: string): Promise<boolean> {
    const lvs = lvstoreNameFor(serial);
    // After an attach, SPDK examines the bdev and loads any lvstore on it asynchronously; looking
    // before examine finished would make an existing lvstore look absent and invite a second one.
    await this.opts.rpc.call("bdev_wait_for_examine").catch((err) => {
      if (!isKind(err, "unimplemented")) throw err;
    });
    const existing = await this.lvstore(lvs);
    if (existing) {
      if (existing.base_bdev !== bdevName) {
        throw new StorageError(
          "precondition",
          `lvstore ${lvs} sits on ${existing.base_bdev}, not on ${bdevName}: refusing to touch it`,
        );
      }
      return true;
    }
    const [base] = await this.m.bdevGetBdevs({ name: bdevName });
    if (base?.claimed) {
      throw new StorageError(
        "precondition",
        `${bdevName} is claimed by another SPDK module (${base.claim_type ?? "unknown"}); not creating ${lvs} on it`,
      );
    }
    await this.checkBlank(serial, bdevName);
    const clear = await this.clearMethod(serial, bdevName);
    try {
      await this.m.bdevLvolCreateLvstore({
        bdev_name: bdevName,
        lvs_name: lvs,
        cluster_sz: ALLOCATION_UNIT,
        clear_method: clear,
      });
      this.opts.logger.info("lvstore created", { lvstore: lvs, bdev: bdevName, clearMethod: clear });
    } catch (err) {
      if (!isKind(err, "already-exists")) throw err;
    }
    return false;
  }

  private async lvstore(name: string) {
    try {
      const [s] = await this.m.bdevLvolGetLvstores({ lvs_name: name });
      return s;
    } catch (err) {
      if (isKind(err, "not-found")) return undefined;
      throw err;
    }
  }

  async findVolume(spec: VolumeSpec): Promise<Volume | undefined> {
    const alias = `${lvstoreNameFor(spec.device.serial)}/${spec.externalId}`;
    try {
      const [b] = await this.m.bdevGetBdevs({ name: alias });
      if (!b) return undefined;
      return { externalId: spec.externalId, backendPath: b.name, sizeBytes: b.num_blocks * b.block_size };
    } catch (err) {
      if (isKind(err, "not-found")) return undefined;
      throw err;
    }
  }

  /** The bdev behind alias "<lvstore of device>/<name>", or undefined. */
  private async lvolByName(device: DeviceRef, name: string) {
    try {
      const [b] = await this.m.bdevGetBdevs({ name: `${lvstoreNameFor(device.serial)}/${name}` });
      return b;
    } catch (err) {
      if (isKind(err, "not-found")) return undefined;
      throw err;
    }
  }

  /**
   * Snapshots lvol `lvolName` (same lvstore as `device`) as `snapshotName` unless that snapshot
   * exists. Resolves with its size. Source missing: "not-found".
   */
  async ensureSnapshot(
    device: DeviceRef,
    lvolName: string,
    snapshotName: string,
  ): Promise<{ sizeBytes: number }> {
    const have = await this.lvolByName(device, snapshotName);
    if (have) return { sizeBytes: have.num_blocks * have.block_size };
    const lvs = lvstoreNameFor(device.serial);
    const src = await this.lvolByName(device, lvolName);
    if (!src) throw new StorageError("not-found", `lvol ${lvs}/${lvolName} to snapshot does not exist`);
    try {
      await this.m.bdevLvolSnapshot(`${lvs}/${lvolName}`, snapshotName);
    } catch (err) {
      if (!isKind(err, "already-exists")) throw err;
    }
    const made = await this.lvolByName(device, snapshotName);
    if (!made)
      throw new StorageError(
        "unavailable",
        `snapshot ${lvs}/${snapshotName} not visible right after creation`,
      );
    this.opts.logger.info("snapshot taken", { source: lvolName, snapshot: snapshotName, bdev: made.name });
    return { sizeBytes: made.num_blocks * made.block_size };
  }

  /**
   * Snapshots several lvols at one point in the target's order: looks every source and snapshot
   * up first, then issues all missing bdev_lvol_snapshot calls in one go (nothing awaited
   * between them, so they reach the RPC server together with no other call between them), then
   * reads the results. Idempotent like ensureSnapshot; sizes in input order. Any source missing:
   * "not-found" before any snapshot is taken.
   */
  async ensureSnapshots(
    items: readonly { device: DeviceRef; lvolName: string; snapshotName: string }[],
  ): Promise<{ sizeBytes: number }[]> {
    const found = await Promise.all(
      items.map(async (i) => ({
        have: await this.lvolByName(i.device, i.snapshotName),
        src: await this.lvolByName(i.device, i.lvolName),
      })),
    );
    for (const [n, f] of found.entries()) {
      const i = items[n] as (typeof items)[number];
      if (!f.have && !f.src)
        throw new StorageError(
          "not-found",
          `lvol ${lvstoreNameFor(i.device.serial)}/${i.lvolName} to snapshot does not exist`,
        );
    }
    const calls: Promise<unknown>[] = [];
    for (const [n, f] of found.entries()) {
      if (f.have) continue;
      const i = items[n] as (typeof items)[number];
      calls.push(
        this.m
          .bdevLvolSnapshot(`${lvstoreNameFor(i.device.serial)}/${i.lvolName}`, i.snapshotName)
          .catch((err) => {
            if (!isKind(err, "already-exists")) throw err;
          }),
      );
    }
    await Promise.all(calls);
    return Promise.all(
      items.map(async (i) => {
        const made = await this.lvolByName(i.device, i.snapshotName);
        if (!made)
          throw new StorageError(
            "unavailable",
            `snapshot ${i.snapshotName} not visible right after creation`,
          );
        return { sizeBytes: made.num_blocks * made.block_size };
      }),
    );
  }

  /**
   * Deletes snapshot `snapshotName`; gone already counts as deleted. SPDK refuses while more than
   * one clone depends on it: "precondition", and nothing changed.
   */
  async deleteSnapshot(device: DeviceRef, snapshotName: string): Promise<void> {
    const copies = this.opts.snapshotCopies;
    if (copies) return copies.run(() => this.deleteSnapshotNow(device, snapshotName));
    return this.deleteSnapshotNow(device, snapshotName);
  }

  private async deleteSnapshotNow(device: DeviceRef, snapshotName: string): Promise<void> {
    const have = await this.lvolByName(device, snapshotName);
    if (!have) return;
    try {
      await this.m.bdevLvolDelete(have.name);
    } catch (err) {
      if (!isKind(err, "not-found")) throw err;
    }
  }

  private async cloneFor(spec: VolumeSpec, source: NonNullable<VolumeSpec["contentSource"]>): Promise<void> {
    const lvs = lvstoreNameFor(spec.device.serial);
    let snap = source.lvolName;
    if (source.kind === "partition") {
      snap = cloneSourceSnapshotFor(spec.externalId);
      await this.ensureSnapshot(spec.device, source.lvolName, snap);
    } else if (!(await this.lvolByName(spec.device, snap))) {
      throw new StorageError("precondition", `source snapshot ${lvs}/${snap} does not exist on this drive`);
    }
    try {
      await this.m.bdevLvolClone(`${lvs}/${snap}`, spec.externalId);
    } catch (err) {
      if (!isKind(err, "already-exists")) throw err;
    }
    this.opts.logger.info("lvol cloned", { externalId: spec.externalId, from: snap });
  }

  /** Finds or creates (see VolumeManager); a failure forgets the facts it may contradict. */
  ensureVolume(spec: VolumeSpec): Promise<Volume> {
    return this.facts.forgetOnError(() => this.findOrCreate(spec));
  }

  private async findOrCreate(spec: VolumeSpec): Promise<Volume> {
    const found = await this.findVolume(spec);
    if (found) return found.sizeBytes < spec.sizeBytes ? this.resizeVolume(spec) : found;
    if (spec.contentSource) {
      await this.cloneFor(spec, spec.contentSource);
      const clone = await this.findVolume(spec);
      if (!clone)
        throw new StorageError("unavailable", `clone ${spec.externalId} not visible right after creation`);
      return clone.sizeBytes < spec.sizeBytes ? this.resizeVolume(spec) : clone;
    }
    const bdevName = spec.device.bdevName;
    if (!bdevName)
      throw new StorageError("precondition", `drive ${spec.device.serial} is not attached to SPDK`);
    const clear = await this.clearMethod(spec.device.serial, bdevName);
    try {
      await this.m.bdevLvolCreate({
        lvol_name: spec.externalId,
        size_in_mib: Math.ceil(spec.sizeBytes / MiB),
        lvs_name: lvstoreNameFor(spec.device.serial),
        // Per volume (spec.thinProvisioning), as the manager's ledger accounted for it.
        thin_provision: spec.thin === true,
        clear_method: clear,
      });
    } catch (err) {
      if (!isKind(err, "already-exists")) throw err;
    }
    const made = await this.findVolume(spec);
    if (!made)
      throw new StorageError("unavailable", `lvol ${spec.externalId} not visible right after creation`);
    this.opts.logger.info("lvol ready", {
      externalId: spec.externalId,
      bdev: made.backendPath,
      bytes: made.sizeBytes,
    });
    return made;
  }

  async resizeVolume(spec: VolumeSpec): Promise<Volume> {
    const found = await this.findVolume(spec);
    if (!found) throw new StorageError("not-found", `lvol ${spec.externalId} does not exist`);
    if (found.sizeBytes >= spec.sizeBytes) return found;
    await this.m.bdevLvolResize(found.backendPath, Math.ceil(spec.sizeBytes / MiB));
    return (await this.findVolume(spec)) ?? found;
  }

  async deleteVolume(spec: VolumeSpec): Promise<void> {
    const found = await this.findVolume(spec);
    if (!found) return;
    try {
      await this.m.bdevLvolDelete(found.backendPath);
    } catch (err) {
      if (!isKind(err, "not-found")) throw err;
    }
    if (spec.contentSource?.kind === "partition") {
      // The hidden snapshot this clone was made through; with the clone gone at most the source
      // depends on it, which SPDK allows (its clusters pass to the source).
      await this.deleteSnapshot(spec.device, cloneSourceSnapshotFor(spec.externalId)).catch((err) => {
        if (!isKind(err, "precondition")) throw err;
      });
    }
  }
}
