// What the node service remembers about each staged volume (its NQN, staging path, access, device
// and publications), persisted so NodeUnstage, NodeGetVolumeStats and a restarted plugin can find
// the connection behind a volume ID: CSI hands those calls nothing but the ID and a path.
import { createHash } from "node:crypto";
import { mkdirSync } from "node:fs";
import * as fsp from "node:fs/promises";
import { join } from "node:path";
import * as v from "valibot";
import { StorageError } from "../../lib/errors.ts";
import type { AccessMode, VolumeAccess } from "./validate.ts";

/** One NodePublish of a staged volume. */
export interface Publication {
  readonly targetPath: string;
  readonly readonly: boolean;
  /** Read-only loop device bound instead of the device itself (read-only raw block publishes). */
  readonly view?: string;
}

const AccessSchema = v.variant("kind", [
  v.object({ kind: v.literal("block") }),
  v.object({
    kind: v.literal("mount"),
    fsType: v.picklist(["ext4", "xfs"]),
    mountFlags: v.array(v.string()),
  }),
]);

const StagedVolumeSchema = v.object({
  volumeId: v.pipe(v.string(), v.minLength(1)),
  stagingPath: v.pipe(v.string(), v.startsWith("/")),
  nqn: v.pipe(v.string(), v.minLength(1)),
  namespaceUUID: v.optional(v.string()),
  access: AccessSchema,
  mode: v.picklist(["SINGLE_NODE_WRITER", "SINGLE_NODE_SINGLE_WRITER", "SINGLE_NODE_MULTI_WRITER"]),
  device: v.optional(v.pipe(v.string(), v.startsWith("/dev/"))),
  publications: v.array(
    v.object({
      targetPath: v.pipe(v.string(), v.startsWith("/")),
      readonly: v.boolean(),
      view: v.optional(v.pipe(v.string(), v.startsWith("/dev/"))),
    }),
  ),
});

/** The record of one staged (or being staged) volume. */
export interface StagedVolume {
  readonly volumeId: string;
  readonly stagingPath: string;
  readonly nqn: string;
  readonly namespaceUUID?: string;
  readonly access: VolumeAccess;
  readonly mode: AccessMode;
  /** Set once the namespace's block device was found. */
  readonly device?: string;
  readonly publications: readonly Publication[];
}

/**
 * Durable per-volume records. put() replaces a record atomically: a crash leaves either the old
 * or the new one. Callers serialise access per volume ID; different IDs may be used concurrently.
 * A record that cannot be read back is StorageError "internal" rather than a silent "absent",
 * because forgetting a volume would leave its connection and mounts behind.
 */
export interface NodeStateStore {
  get(volumeId: string): Promise<StagedVolume | undefined>;
  put(record: StagedVolume): Promise<void>;
  /** Removes the record; absent is fine. */
  delete(volumeId: string): Promise<void>;
  list(): Promise<StagedVolume[]>;
}

/** Parses a record file's text; StorageError "internal" for anything that is not a record. */
export function parseStagedVolume(text: string, origin: string): StagedVolume {
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch (err) {
    throw new StorageError("internal", `node state ${origin} is not JSON`, { cause: err });
  }
  const r = v.safeParse(StagedVolumeSchema, raw);
  if (!r.success) {
    throw new StorageError("internal", `node state ${origin} is malformed: ${r.issues[0]?.message}`);
  }
  return r.output;
}

/**
 * A NodeStateStore of one JSON file per volume in `dir` (created if missing), named by the
 * SHA-256 of the volume ID because IDs may hold any character. Writes go to a temporary file that
 * is synced and renamed over the record.
 */
export class FileStateStore implements NodeStateStore {
  constructor(readonly dir: string) {
    mkdirSync(dir, { recursive: true, mode: 0o700 });
  }

  #path(volumeId: string): string {
    return join(this.dir, `${createHash("sha256").update(volumeId).digest("hex")}.json`);
  }

  async get(volumeId: string): Promise<StagedVolume | undefined> {
    const path = this.#path(volumeId);
    let text: string;
    try {
      text = await fsp.readFile(path, "utf8");
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === "ENOENT") return undefined;
      throw new StorageError("internal", `cannot read node state ${path}: ${(err as Error).message}`, {
        cause: err,
      });
    }
    const record = parseStagedVolume(text, path);
    if (record.volumeId !== volumeId)
      throw new StorageError("internal", `node state ${path} belongs to another volume`);
    return record;
  }

  async put(record: StagedVolume): Promise<void> {
    const path = this.#path(record.volumeId);
    const tmp = `${path}.tmp`;
    const fh = await fsp.open(tmp, "w", 0o600);
    try {
      await fh.writeFile(`${JSON.stringify(record, null, 2)}\n`);
      await fh.sync();
    } finally {
      await fh.close();
    }
    await fsp.rename(tmp, path);
  }

  async delete(volumeId: string): Promise<void> {
    await fsp.rm(this.#path(volumeId), { force: true });
  }

  async list(): Promise<StagedVolume[]> {
    const out: StagedVolume[] = [];
    for (const name of (await fsp.readdir(this.dir)).sort()) {
      if (!name.endsWith(".json")) continue;
      const path = join(this.dir, name);
      out.push(parseStagedVolume(await fsp.readFile(path, "utf8"), path));
    }
    return out;
  }
}
