// What the plugin remembers about each device beyond what SNAP can tell (the request's access
// modes, volume mode and contexts, and whether creation finished): one small JSON file per volume,
// written atomically, so GetDevice and ListDevices survive a plugin restart.
import { createHash } from "node:crypto";
import * as fsp from "node:fs/promises";
import { join } from "node:path";
import * as v from "valibot";
import { StorageError } from "../../lib/errors.ts";

const StringMap = v.record(v.string(), v.string());

const DeviceRecordSchema = v.object({
  version: v.literal(1),
  volumeId: v.pipe(v.string(), v.minLength(1)),
  deviceName: v.pipe(v.string(), v.minLength(1)),
  /** "creating" from before the first change in SNAP until every step is done; then "ready". */
  phase: v.picklist(["creating", "ready"]),
  accessModes: v.array(v.pipe(v.number(), v.integer(), v.minValue(1), v.maxValue(4))),
  volumeMode: v.picklist(["Block", "Filesystem"]),
  nqn: v.pipe(v.string(), v.minLength(1)),
  publishContext: StringMap,
  volumeContext: StringMap,
  storageParameters: StringMap,
  createdAt: v.string(),
  updatedAt: v.string(),
});

/** One device as saved. Carries no secret: storage parameters only name a Secret. */
export type DeviceRecord = v.InferOutput<typeof DeviceRecordSchema>;

/**
 * Durable device records. put() replaces a record atomically (a crash leaves the old or the new
 * one). Callers serialise per volume id; different ids may be used concurrently. A record that
 * cannot be read back is StorageError "internal", never a silent "absent": forgetting a device
 * would hide an attached volume.
 */
export interface DeviceStore {
  get(volumeId: string): Promise<DeviceRecord | undefined>;
  put(record: DeviceRecord): Promise<void>;
  /** Absent is fine. */
  delete(volumeId: string): Promise<void>;
  /** Every record, in no particular order. */
  list(): Promise<DeviceRecord[]>;
  /** Throws unless the store can be read and written (Probe's health check). */
  check(): Promise<void>;
}

/** Parses a record file's text; "internal" for anything else. */
export function parseDeviceRecord(text: string, origin: string): DeviceRecord {
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch (err) {
    throw new StorageError("internal", `device record ${origin} is not JSON`, { cause: err });
  }
  const r = v.safeParse(DeviceRecordSchema, raw);
  if (!r.success) {
    const i = r.issues[0];
    throw new StorageError(
      "internal",
      `device record ${origin} is malformed: ${v.getDotPath(i) ?? ""} ${i.message}`,
    );
  }
  return r.output;
}

function fsError(what: string, path: string, err: unknown): StorageError {
  return new StorageError("internal", `cannot ${what} device record ${path}: ${(err as Error).message}`, {
    cause: err,
  });
}

/**
 * A DeviceStore of one `<sha256(volume id)>.json` file per volume in `dir` (created 0700 if
 * missing; volume ids may hold any character). Writes go to a synced temporary file renamed over
 * the record, then the directory is synced so the rename survives a power cut.
 */
export class FileDeviceStore implements DeviceStore {
  constructor(readonly dir: string) {}

  #path(volumeId: string): string {
    return join(this.dir, `${createHash("sha256").update(volumeId).digest("hex")}.json`);
  }

  async #ensureDir(): Promise<void> {
    await fsp.mkdir(this.dir, { recursive: true, mode: 0o700 });
  }

  async get(volumeId: string): Promise<DeviceRecord | undefined> {
    const path = this.#path(volumeId);
    let text: string;
    try {
      text = await fsp.readFile(path, "utf8");
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === "ENOENT") return undefined;
      throw fsError("read", path, err);
    }
    const record = parseDeviceRecord(text, path);
    if (record.volumeId !== volumeId)
      throw new StorageError("internal", `device record ${path} belongs to another volume`);
    return record;
  }

  async put(record: DeviceRecord): Promise<void> {
    const r = v.safeParse(DeviceRecordSchema, record);
    if (!r.success)
      throw new StorageError(
        "internal",
        `refusing to save a malformed device record: ${r.issues[0].message}`,
      );
    const path = this.#path(record.volumeId);
    const tmp = `${path}.tmp`;
    try {
      await this.#ensureDir();
      const fh = await fsp.open(tmp, "w", 0o600);
      try {
        await fh.writeFile(`${JSON.stringify(record, null, 2)}\n`);
        await fh.sync();
      } finally {
        await fh.close();
      }
      await fsp.rename(tmp, path);
      await this.#syncDir();
    } catch (err) {
      throw fsError("write", path, err);
    }
  }

  async delete(volumeId: string): Promise<void> {
    const path = this.#path(volumeId);
    try {
      await fsp.rm(path, { force: true });
      await this.#syncDir();
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === "ENOENT") return;
      throw fsError("remove", path, err);
    }
  }

  async list(): Promise<DeviceRecord[]> {
    let names: string[];
    try {
      names = await fsp.readdir(this.dir);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === "ENOENT") return [];
      throw fsError("list", this.dir, err);
    }
    const out: DeviceRecord[] = [];
    for (const name of names) {
      // A leftover .tmp is a write that never completed: the record it was replacing still stands.
      if (!/^[0-9a-f]{64}\.json$/.test(name)) continue;
      const path = join(this.dir, name);
      let text: string;
      try {
        text = await fsp.readFile(path, "utf8");
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code === "ENOENT") continue; // deleted meanwhile
        throw fsError("read", path, err);
      }
      out.push(parseDeviceRecord(text, path));
    }
    return out;
  }

  async check(): Promise<void> {
    try {
      await this.#ensureDir();
      await fsp.access(this.dir, fsp.constants.R_OK | fsp.constants.W_OK | fsp.constants.X_OK);
    } catch (err) {
      throw new StorageError(
        "internal",
        `state directory ${this.dir} is not usable: ${(err as Error).message}`,
        {
          cause: err,
        },
      );
    }
  }

  async #syncDir(): Promise<void> {
    const dh = await fsp.open(this.dir, "r");
    try {
      await dh.sync();
    } finally {
      await dh.close();
    }
  }
}
