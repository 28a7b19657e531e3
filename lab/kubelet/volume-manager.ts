// The kubelet stand-in's CSI node-side calls: stage, publish, unpublish, unstage and expand, each
// recorded on disk (vol_data.json beside the paths, as kubelet keeps them) before the call, so a
// restarted stand-in on the same root finds every staging and publication it must undo.
import { mkdir, readdir, readFile, rmdir, unlink, writeFile } from "node:fs/promises";
import { dirname, join } from "node:path";
import { Node } from "../../gen/csi/v1/csi_pb.ts";
import { errorMessage } from "../../lib/errors.ts";
import { GrpcCallError, type GrpcJsClient } from "../../lib/grpc/grpc-js-client.ts";
import {
  csiPluginDir,
  podDir,
  publicationRecordDir,
  stagingRecordDir,
  VOL_DATA_FILE,
  type VolumeMode,
} from "./naming.ts";
import type { VolumeCapabilityInit } from "./volume-spec.ts";

/** A volume this node has staged (or begun to stage). */
export interface StageRecord {
  volumeHandle: string;
  driverName: string;
  pvName: string;
  mode: VolumeMode;
  stagingPath: string;
  uniqueName: string;
}

/** One Pod's publication of a volume (or one begun). Field names follow kubelet's vol_data.json. */
export interface PublicationRecord {
  specVolID: string;
  volumeHandle: string;
  driverName: string;
  nodeName: string;
  podUID: string;
  mode: VolumeMode;
  stagingPath: string;
  publishPath: string;
  uniqueName: string;
  readOnly: boolean;
  attachmentID: string;
  volumeLifecycleMode: "Persistent";
}

/** Everything a stage or publish call needs about one volume. */
export interface VolumeCall {
  volumeHandle: string;
  pvName: string;
  mode: VolumeMode;
  uniqueName: string;
  attachmentID: string;
  stagingPath: string;
  capability: VolumeCapabilityInit;
  volumeContext: Record<string, string>;
  publishContext: Record<string, string>;
  stageSecrets: Record<string, string>;
  publishSecrets: Record<string, string>;
}

/** The node, driver and socket a VolumeManager works with. */
export interface VolumeManagerOptions {
  rootDir: string;
  nodeName: string;
  driver: string;
  csi: GrpcJsClient;
  /** The driver offers STAGE_UNSTAGE_VOLUME: stage before publish, unstage after the last unpublish. */
  stageUnstage: boolean;
  /** Deadline of each CSI call. Default 120 s. */
  callTimeoutMs?: number;
}

/** A CSI call that failed, named after the RPC; `code` is the gRPC status (undefined for a local failure). */
export class CsiCallError extends Error {
  override readonly name = "CsiCallError";
  constructor(
    readonly rpc: string,
    readonly code: number | undefined,
    message: string,
  ) {
    super(`${rpc}: ${message}`);
  }
}

/** Serializes async work per key; different keys run concurrently. */
class KeyedMutex {
  private readonly tails = new Map<string, Promise<unknown>>();

  run<T>(key: string, fn: () => Promise<T>): Promise<T> {
    const prev = this.tails.get(key) ?? Promise.resolve();
    const next = prev.then(fn, fn);
    const tail = next.catch(() => {});
    this.tails.set(key, tail);
    void tail.then(() => {
      if (this.tails.get(key) === tail) this.tails.delete(key);
    });
    return next;
  }
}

async function readJson<T>(path: string): Promise<T | undefined> {
  try {
    return JSON.parse(await readFile(path, "utf8")) as T;
  } catch {
    return undefined;
  }
}

async function list(dir: string): Promise<string[]> {
  try {
    return await readdir(dir);
  } catch {
    return [];
  }
}

/** rmdir that tolerates a missing or non-empty directory (a mount point stays: EBUSY is tolerated too). */
async function rmdirIfEmpty(dir: string): Promise<void> {
  try {
    await rmdir(dir);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code !== "ENOENT" && code !== "ENOTEMPTY" && code !== "EEXIST" && code !== "EBUSY") throw err;
  }
}

async function unlinkIfPresent(path: string): Promise<void> {
  try {
    await unlink(path);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== "ENOENT") throw err;
  }
}

const pubKey = (podUID: string, pvName: string) => `${podUID}/${pvName}`;

/**
 * Stages and publishes volumes through the CSI node service. Calls on one volume are serialized
 * (per volume handle), so stage/unstage decisions never interleave; calls on different volumes
 * run concurrently. Every method is idempotent, as the CSI calls are, and throws CsiCallError on
 * a failed call with the records left as they were (the caller retries).
 */
export class VolumeManager {
  private readonly staged = new Map<string, StageRecord>();
  private readonly published = new Map<string, PublicationRecord>();
  private readonly locks = new KeyedMutex();
  private readonly timeoutMs: number;

  constructor(private readonly o: VolumeManagerOptions) {
    this.timeoutMs = o.callTimeoutMs ?? 120_000;
  }

  /** Reads every record under the root (what a previous instance left). Call once, before use. */
  async load(): Promise<void> {
    const plugin = csiPluginDir(this.o.rootDir);
    const stagingFiles = [
      ...(await list(join(plugin, this.o.driver))).map((d) => join(plugin, this.o.driver, d, VOL_DATA_FILE)),
      ...(await list(join(plugin, "volumeDevices")))
        .filter((d) => d !== "staging" && d !== "publish")
        .map((d) => join(plugin, "volumeDevices", d, "data", VOL_DATA_FILE)),
    ];
    for (const f of stagingFiles) {
      const rec = await readJson<StageRecord>(f);
      if (rec?.driverName === this.o.driver && rec.volumeHandle) this.staged.set(rec.volumeHandle, rec);
    }
    for (const uid of await this.podUIDsOnDisk()) {
      for (const kind of ["volumes", "volumeDevices"]) {
        const base = join(podDir(this.o.rootDir, uid), kind, "kubernetes.io~csi");
        for (const pv of await list(base)) {
          const rec = await readJson<PublicationRecord>(join(base, pv, VOL_DATA_FILE));
          if (rec?.driverName === this.o.driver && rec.volumeHandle)
            this.published.set(pubKey(rec.podUID, rec.specVolID), rec);
        }
      }
    }
  }

  /** UIDs of the Pod directories under <root>/pods. */
  async podUIDsOnDisk(): Promise<string[]> {
    return list(join(this.o.rootDir, "pods"));
  }

  /** Unique names of every volume staged or published here (what volumesInUse must keep). */
  inUseNames(): string[] {
    return [
      ...[...this.staged.values()].map((r) => r.uniqueName),
      ...[...this.published.values()].map((r) => r.uniqueName),
    ];
  }

  stagedRecords(): StageRecord[] {
    return [...this.staged.values()];
  }

  publicationsOf(podUID: string): PublicationRecord[] {
    return [...this.published.values()].filter((p) => p.podUID === podUID);
  }

  publication(podUID: string, pvName: string): PublicationRecord | undefined {
    return this.published.get(pubKey(podUID, pvName));
  }

  private async call<T>(rpc: string, fn: () => Promise<T>): Promise<T> {
    try {
      return await fn();
    } catch (err) {
      if (err instanceof GrpcCallError) throw new CsiCallError(rpc, err.code, err.message);
      throw new CsiCallError(rpc, undefined, errorMessage(err));
    }
  }

  /**
   * NodeStageVolume at the volume's staging path (created first, as kubelet does), recorded
   * before the call. A driver without STAGE_UNSTAGE_VOLUME is only recorded.
   */
  async stage(v: VolumeCall): Promise<void> {
    await this.locks.run(v.volumeHandle, async () => {
      const rec: StageRecord = {
        volumeHandle: v.volumeHandle,
        driverName: this.o.driver,
        pvName: v.pvName,
        mode: v.mode,
        stagingPath: v.stagingPath,
        uniqueName: v.uniqueName,
      };
      const recordDir = stagingRecordDir(this.o.rootDir, { ...v, driver: this.o.driver });
      await mkdir(recordDir, { recursive: true, mode: 0o750 });
      await writeFile(join(recordDir, VOL_DATA_FILE), JSON.stringify(rec));
      this.staged.set(v.volumeHandle, rec);
      if (!this.o.stageUnstage) return;
      await mkdir(v.stagingPath, { recursive: true, mode: 0o750 });
      await this.call("NodeStageVolume", () =>
        this.o.csi.unary(
          Node.method.nodeStageVolume,
          {
            volumeId: v.volumeHandle,
            publishContext: v.publishContext,
            stagingTargetPath: v.stagingPath,
            volumeCapability: v.capability,
            secrets: v.stageSecrets,
            volumeContext: v.volumeContext,
          },
          { timeoutMs: this.timeoutMs },
        ),
      );
    });
  }

  /**
   * NodePublishVolume at `publishPath`. kubelet creates only the parent directory; the driver
   * creates the target itself (a directory for a filesystem, a file for a block volume).
   */
  async publish(v: VolumeCall, o: { podUID: string; publishPath: string; readOnly: boolean }): Promise<void> {
    await this.locks.run(v.volumeHandle, async () => {
      const rec: PublicationRecord = {
        specVolID: v.pvName,
        volumeHandle: v.volumeHandle,
        driverName: this.o.driver,
        nodeName: this.o.nodeName,
        podUID: o.podUID,
        mode: v.mode,
        stagingPath: v.stagingPath,
        publishPath: o.publishPath,
        uniqueName: v.uniqueName,
        readOnly: o.readOnly,
        attachmentID: v.attachmentID,
        volumeLifecycleMode: "Persistent",
      };
      const recordDir = publicationRecordDir(this.o.rootDir, {
        podUID: o.podUID,
        pvName: v.pvName,
        mode: v.mode,
      });
      await mkdir(recordDir, { recursive: true, mode: 0o750 });
      await mkdir(dirname(o.publishPath), { recursive: true, mode: 0o750 });
      await writeFile(join(recordDir, VOL_DATA_FILE), JSON.stringify(rec));
      this.published.set(pubKey(o.podUID, v.pvName), rec);
      await this.call("NodePublishVolume", () =>
        this.o.csi.unary(
          Node.method.nodePublishVolume,
          {
            volumeId: v.volumeHandle,
            publishContext: v.publishContext,
            stagingTargetPath: this.o.stageUnstage ? v.stagingPath : "",
            targetPath: o.publishPath,
            volumeCapability: v.capability,
            readonly: o.readOnly,
            secrets: v.publishSecrets,
            volumeContext: v.volumeContext,
          },
          { timeoutMs: this.timeoutMs },
        ),
      );
    });
  }

  /** NodeUnpublishVolume, then the record and the now empty directories go. */
  async unpublish(rec: PublicationRecord): Promise<void> {
    await this.locks.run(rec.volumeHandle, async () => {
      await this.call("NodeUnpublishVolume", () =>
        this.o.csi.unary(
          Node.method.nodeUnpublishVolume,
          { volumeId: rec.volumeHandle, targetPath: rec.publishPath },
          { timeoutMs: this.timeoutMs },
        ),
      );
      const recordDir = publicationRecordDir(this.o.rootDir, {
        podUID: rec.podUID,
        pvName: rec.specVolID,
        mode: rec.mode,
      });
      await unlinkIfPresent(join(recordDir, VOL_DATA_FILE));
      // The driver removes the target; whatever remains is only ever removed when empty.
      if (rec.mode === "Filesystem") await rmdirIfEmpty(rec.publishPath);
      await rmdirIfEmpty(recordDir);
      if (rec.mode === "Block") await rmdirIfEmpty(dirname(rec.publishPath));
      this.published.delete(pubKey(rec.podUID, rec.specVolID));
    });
  }

  /**
   * NodeUnstageVolume when no publication of the volume remains on this node and `wanted` does
   * not claim it (a Pod about to use it); then the staging directory and record go. Returns
   * "unstaged" when this call unstaged it, "absent" when it was not staged, "in-use" otherwise.
   */
  async unstageIfUnused(
    volumeHandle: string,
    wanted: (volumeHandle: string) => boolean,
  ): Promise<"unstaged" | "absent" | "in-use"> {
    return this.locks.run(volumeHandle, async () => {
      const rec = this.staged.get(volumeHandle);
      if (rec === undefined) return "absent";
      if ([...this.published.values()].some((p) => p.volumeHandle === volumeHandle) || wanted(volumeHandle))
        return "in-use";
      if (this.o.stageUnstage) {
        await this.call("NodeUnstageVolume", () =>
          this.o.csi.unary(
            Node.method.nodeUnstageVolume,
            { volumeId: volumeHandle, stagingTargetPath: rec.stagingPath },
            { timeoutMs: this.timeoutMs },
          ),
        );
      }
      const recordDir = stagingRecordDir(this.o.rootDir, { ...rec, driver: this.o.driver });
      await rmdirIfEmpty(rec.stagingPath);
      await unlinkIfPresent(join(recordDir, VOL_DATA_FILE));
      await rmdirIfEmpty(recordDir);
      if (rec.mode === "Block") await rmdirIfEmpty(dirname(recordDir));
      this.staged.delete(volumeHandle);
      return "unstaged";
    });
  }

  /** NodeExpandVolume on a published volume; returns the size the driver reports (0 when unknown). */
  async expand(
    rec: PublicationRecord,
    o: { requiredBytes: bigint; capability: VolumeCapabilityInit },
  ): Promise<bigint> {
    return this.locks.run(rec.volumeHandle, async () => {
      const res = await this.call("NodeExpandVolume", () =>
        this.o.csi.unary(
          Node.method.nodeExpandVolume,
          {
            volumeId: rec.volumeHandle,
            volumePath: rec.publishPath,
            stagingTargetPath: this.o.stageUnstage ? rec.stagingPath : "",
            capacityRange: { requiredBytes: o.requiredBytes },
            volumeCapability: o.capability,
          },
          { timeoutMs: this.timeoutMs },
        ),
      );
      return res.capacityBytes;
    });
  }

  /** Removes a Pod's directory once nothing of it remains (never recursively: a mount may be inside). */
  async removePodDirIfEmpty(podUID: string): Promise<void> {
    const dir = podDir(this.o.rootDir, podUID);
    for (const kind of ["volumes", "volumeDevices"]) {
      const base = join(dir, kind, "kubernetes.io~csi");
      for (const pv of await list(base)) await rmdirIfEmpty(join(base, pv));
      await rmdirIfEmpty(base);
      await rmdirIfEmpty(join(dir, kind));
    }
    await rmdirIfEmpty(dir);
  }
}
