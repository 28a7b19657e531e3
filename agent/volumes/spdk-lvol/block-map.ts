// Changed-block records of lvol snapshots, read from SPDK. SPDK v25.05.1 has no call that lists
// the clusters an lvol holds (bdev_lvol_get_lvols gives only their number), but a shallow copy
// (bdev_lvol_start_shallow_copy) writes exactly a read-only lvol's own clusters, and nothing
// else, into a destination bdev. Copied into an AIO bdev on a fresh sparse file, those clusters
// are the file's only data extents (SEEK_DATA/SEEK_HOLE). A snapshot's own clusters are the ones
// written between the snapshot before it and itself, so a record per snapshot answers both "what
// is allocated" (the union along the chain) and "what changed since snapshot A" (the union after A).
import { randomBytes } from "node:crypto";
import { closeSync, ftruncateSync, mkdirSync, openSync, rmSync } from "node:fs";
import { join } from "node:path";
import type { Clock } from "../../../lib/clock.ts";
import { clustersOfRanges, unionClusters } from "../../../lib/cluster-map.ts";
import { Mutex } from "../../../lib/concurrency/mutex.ts";
import { StorageError } from "../../../lib/errors.ts";
import { allocatedRanges } from "../../../lib/fs/allocated-ranges.ts";
import type { Logger } from "../../../lib/log.ts";
import type { SpdkMethods } from "../../../lib/spdk/methods.ts";
import type { Bdev } from "../../../lib/spdk/schemas.ts";
import type { DeviceRef } from "../../backends/types.ts";
import { lvstoreNameFor } from "../../partitions/identity.ts";

/** A snapshot lvol DISTORT made for an NVMeSnapshot (snapshotExternalIdFor), not a clone's source. */
export function isSnapshotLvolName(name: string): boolean {
  return /^snap-[0-9a-f]{20}$/.test(name);
}

/** What a record is read from: the lvols from the snapshot up to its parent snapshot. */
export interface BlockMapOrigin {
  /** "<lvol>:<allocated clusters>" of each lvol from the snapshot up, comma-separated. */
  fingerprint: string;
  /** The nearest ancestor that is an NVMeSnapshot's lvol; undefined at the root. */
  parentSnapshot?: string;
}

export interface BlockMapReading extends BlockMapOrigin {
  clusterSizeBytes: number;
  numClusters: number;
  /** Sorted cluster indices the snapshot holds itself (with any unrecorded ancestors' folded in). */
  clusters: number[];
}

export interface SpdkBlockMapsOptions {
  methods: SpdkMethods;
  /** A directory nvmf_tgt can create files in at the same path (the AIO bdev opens it). */
  scratchDir: string;
  clock: Clock;
  logger: Logger;
  /** Poll period of bdev_lvol_check_shallow_copy. Default 20 ms. */
  pollMs?: number;
  /** Longest a shallow copy may run. Default 10 minutes. */
  copyTimeoutMs?: number;
  /**
   * Held while snapshots are copied; the volume manager deletes snapshots under the same lock
   * (SpdkLvolOptions.snapshotCopies). Default: a lock of its own.
   */
  copies?: Mutex;
}

function isKind(err: unknown, kind: string): boolean {
  return err instanceof StorageError && err.kind === kind;
}

/** The lvol bdev part of bdev_get_bdevs, refused when the bdev is not an lvol. */
function lvolInfo(b: Bdev, name: string) {
  const l = b.driver_specific?.lvol;
  if (!l) throw new StorageError("internal", `bdev ${name} is not an lvol`);
  return l;
}

/**
 * Reads snapshot records through SPDK. One shallow copy at a time per agent: each costs a write
 * of the snapshot's own clusters into scratch space, so they are not run side by side.
 */
export class SpdkBlockMaps {
  private readonly m: SpdkMethods;
  private readonly copies: Mutex;

  constructor(private readonly o: SpdkBlockMapsOptions) {
    this.m = o.methods;
    this.copies = o.copies ?? new Mutex();
  }

  private async bdev(lvs: string, name: string): Promise<Bdev | undefined> {
    try {
      const [b] = await this.m.bdevGetBdevs({ name: `${lvs}/${name}` });
      return b;
    } catch (err) {
      if (isKind(err, "not-found")) return undefined;
      throw err;
    }
  }

  /**
   * The lvols a record of `snapshotName` covers: the snapshot and, up its base_snapshot chain,
   * every lvol that is not an NVMeSnapshot's (a clone's source snapshot), until one that is.
   * Snapshot gone: "not-found". An ancestor vanishing midway: "unavailable" (a merge is running).
   */
  private async chain(device: DeviceRef, snapshotName: string) {
    const lvs = lvstoreNameFor(device.serial);
    const head = await this.bdev(lvs, snapshotName);
    if (!head) throw new StorageError("not-found", `snapshot ${lvs}/${snapshotName} does not exist`);
    if (!lvolInfo(head, snapshotName).snapshot)
      throw new StorageError("invalid", `${lvs}/${snapshotName} is not a snapshot`);
    const lvols: { name: string; bdev: Bdev }[] = [{ name: snapshotName, bdev: head }];
    let parentSnapshot: string | undefined;
    for (let cur = head; ; ) {
      const parent = lvolInfo(cur, lvols[lvols.length - 1]?.name ?? snapshotName).base_snapshot;
      if (parent === undefined) break;
      if (isSnapshotLvolName(parent)) {
        parentSnapshot = parent;
        break;
      }
      if (lvols.length > 64)
        throw new StorageError("internal", `snapshot chain of ${snapshotName} is too long`);
      const next = await this.bdev(lvs, parent);
      if (!next)
        throw new StorageError("unavailable", `ancestor ${lvs}/${parent} of ${snapshotName} vanished`);
      lvols.push({ name: parent, bdev: next });
      cur = next;
    }
    const fingerprint = lvols
      .map((l) => `${l.name}:${lvolInfo(l.bdev, l.name).num_allocated_clusters ?? 0}`)
      .join(",");
    return { lvs, lvols, parentSnapshot, fingerprint };
  }

  /** Where a record of the snapshot would come from now: lookups only, no copy. */
  async origin(device: DeviceRef, snapshotName: string): Promise<BlockMapOrigin> {
    const c = await this.chain(device, snapshotName);
    return c.parentSnapshot === undefined
      ? { fingerprint: c.fingerprint }
      : { fingerprint: c.fingerprint, parentSnapshot: c.parentSnapshot };
  }

  /**
   * Reads the snapshot's record: a shallow copy of each lvol of its chain, the clusters each
   * allocated checked against SPDK's own count. One read at a time per agent, and no snapshot
   * deletion meanwhile (see SpdkLvolOptions.snapshotCopies).
   */
  read(device: DeviceRef, snapshotName: string): Promise<BlockMapReading> {
    return this.copies.run(() => this.readNow(device, snapshotName));
  }

  private async readNow(device: DeviceRef, snapshotName: string): Promise<BlockMapReading> {
    const c = await this.chain(device, snapshotName);
    let store: { cluster_size: number } | undefined;
    try {
      [store] = await this.m.bdevLvolGetLvstores({ lvs_name: c.lvs });
    } catch (err) {
      if (!isKind(err, "not-found")) throw err;
    }
    if (!store) throw new StorageError("not-found", `lvstore ${c.lvs} is not loaded`);
    const clusterSize = store.cluster_size;
    const sizeBytes = c.lvols[0]?.bdev ? c.lvols[0].bdev.num_blocks * c.lvols[0].bdev.block_size : 0;
    const lists: number[][] = [];
    for (const l of c.lvols) lists.push(await this.copyClusters(c.lvs, l.name, l.bdev, clusterSize));
    // A merge between the walk and the copies changes the counts: read again later.
    const after = await this.chain(device, snapshotName);
    if (after.fingerprint !== c.fingerprint)
      throw new StorageError("unavailable", `snapshot ${snapshotName} changed while it was read (a merge)`);
    const reading: BlockMapReading = {
      clusterSizeBytes: clusterSize,
      numClusters: Math.ceil(sizeBytes / clusterSize),
      clusters: unionClusters(lists),
      fingerprint: c.fingerprint,
    };
    if (c.parentSnapshot !== undefined) reading.parentSnapshot = c.parentSnapshot;
    return reading;
  }

  /** One lvol's own clusters, by a shallow copy into an AIO bdev on a sparse scratch file. */
  private async copyClusters(lvs: string, name: string, b: Bdev, clusterSize: number): Promise<number[]> {
    const own = lvolInfo(b, name).num_allocated_clusters ?? 0;
    if (own === 0) return [];
    mkdirSync(this.o.scratchDir, { recursive: true, mode: 0o700 });
    const tag = randomBytes(6).toString("hex");
    const file = join(this.o.scratchDir, `${name}.${tag}.map`);
    const aio = `distort-bm-${tag}`;
    const fd = openSync(file, "wx", 0o600);
    try {
      ftruncateSync(fd, b.num_blocks * b.block_size);
    } finally {
      closeSync(fd);
    }
    try {
      await this.m.bdevAioCreate({ name: aio, filename: file, block_size: b.block_size });
      let state: Awaited<ReturnType<SpdkMethods["lvolCheckShallowCopy"]>>;
      try {
        const { operation_id } = await this.m.lvolStartShallowCopy({
          src_lvol_name: `${lvs}/${name}`,
          dst_bdev_name: aio,
        });
        const deadline = this.o.clock.now() + (this.o.copyTimeoutMs ?? 600_000);
        for (;;) {
          state = await this.m.lvolCheckShallowCopy(operation_id);
          if (state.state !== "in progress") break;
          if (this.o.clock.now() > deadline)
            throw new StorageError("timeout", `shallow copy of ${lvs}/${name} still running`);
          await this.o.clock.sleep(this.o.pollMs ?? 20);
        }
      } finally {
        await this.m.bdevAioDelete(aio).catch((err) => {
          if (!isKind(err, "not-found")) throw err;
        });
      }
      if (state.state === "error")
        throw new StorageError(
          "unavailable",
          `shallow copy of ${lvs}/${name} failed: ${state.error ?? "unknown"}`,
        );
      const clusters = clustersOfRanges(allocatedRanges(file), clusterSize);
      // SPDK counted the clusters it copied: a file that says otherwise is not trusted.
      if (clusters.length !== state.total_clusters || state.copied_clusters !== state.total_clusters)
        throw new StorageError(
          "internal",
          `shallow copy of ${lvs}/${name} left ${clusters.length} clusters in ${file}, SPDK copied ${state.copied_clusters} of ${state.total_clusters}`,
        );
      this.o.logger.debug("snapshot clusters read", { lvol: `${lvs}/${name}`, clusters: clusters.length });
      return clusters;
    } finally {
      rmSync(file, { force: true });
    }
  }
}
