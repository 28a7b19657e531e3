// A durable store of small JSON records, one file per key named by the key's SHA-256, each write
// made atomic and crash-safe (synced temporary file, rename, synced directory). The CSI node
// service's staged volumes and the DPU plugin's device records are both kept this way.
import { createHash } from "node:crypto";
import * as fsp from "node:fs/promises";
import { join } from "node:path";
import * as v from "valibot";
import { StorageError } from "./errors.ts";

/** What a store holds: the record schema, the key of a record, and a noun for messages. */
export interface RecordKind<T> {
  readonly schema: v.GenericSchema<unknown, T>;
  /** The key a record is filed under (a volume ID...); any characters. */
  key(record: T): string;
  /** Names the records in error messages ("node state", "device record"). */
  readonly what: string;
}

/**
 * Parses a record file's text against `kind.schema`; StorageError "internal" for anything that is
 * not such a record (not JSON, or malformed, naming the first bad field).
 */
export function parseRecord<T>(kind: RecordKind<T>, text: string, origin: string): T {
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch (err) {
    throw new StorageError("internal", `${kind.what} ${origin} is not JSON`, { cause: err });
  }
  const r = v.safeParse(kind.schema, raw);
  if (!r.success) {
    const i = r.issues[0];
    const at = v.getDotPath(i);
    throw new StorageError(
      "internal",
      `${kind.what} ${origin} is malformed: ${at ? `${at} ` : ""}${i.message}`,
    );
  }
  return r.output;
}

const RECORD_FILE = /^[0-9a-f]{64}\.json$/;

/**
 * Records of one kind in `dir` (created 0700 on first write; files are 0600). put() replaces a
 * record atomically and durably: a crash or power cut leaves either the old or the new record.
 * Callers serialise access per key; different keys may be used concurrently. A record that cannot
 * be read back is StorageError "internal", never a silent "absent": forgetting a record would
 * leave what it describes (a connection, a device) behind. Every file-system failure is
 * StorageError "internal".
 */
export class JsonRecordStore<T> {
  constructor(
    readonly dir: string,
    readonly kind: RecordKind<T>,
  ) {}

  #path(key: string): string {
    return join(this.dir, `${createHash("sha256").update(key).digest("hex")}.json`);
  }

  #fsError(what: string, path: string, err: unknown): StorageError {
    return new StorageError(
      "internal",
      `cannot ${what} ${this.kind.what} ${path}: ${(err as Error).message}`,
      {
        cause: err,
      },
    );
  }

  /** The record filed under `key`, or undefined when there is none. */
  async get(key: string): Promise<T | undefined> {
    const path = this.#path(key);
    let text: string;
    try {
      text = await fsp.readFile(path, "utf8");
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === "ENOENT") return undefined;
      throw this.#fsError("read", path, err);
    }
    const record = parseRecord(this.kind, text, path);
    if (this.kind.key(record) !== key)
      throw new StorageError("internal", `${this.kind.what} ${path} belongs to another key`);
    return record;
  }

  /** Writes `record` under its key, replacing any previous one; refuses a malformed record. */
  async put(record: T): Promise<void> {
    const r = v.safeParse(this.kind.schema, record);
    if (!r.success)
      throw new StorageError(
        "internal",
        `refusing to save a malformed ${this.kind.what}: ${r.issues[0].message}`,
      );
    const path = this.#path(this.kind.key(record));
    const tmp = `${path}.tmp`;
    try {
      await fsp.mkdir(this.dir, { recursive: true, mode: 0o700 });
      const fh = await fsp.open(tmp, "w", 0o600);
      try {
        await fh.writeFile(`${JSON.stringify(record, null, 2)}\n`);
        await fh.sync();
      } finally {
        await fh.close();
      }
      await fsp.rename(tmp, path);
      // Without this the rename itself may not survive a power cut.
      await this.#syncDir();
    } catch (err) {
      throw this.#fsError("write", path, err);
    }
  }

  /** Removes the record under `key`; absent is fine. */
  async delete(key: string): Promise<void> {
    const path = this.#path(key);
    try {
      await fsp.rm(path, { force: true });
      await this.#syncDir();
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === "ENOENT") return;
      throw this.#fsError("remove", path, err);
    }
  }

  /** Every record, in file-name order (stable, but unrelated to the keys). */
  async list(): Promise<T[]> {
    let names: string[];
    try {
      names = await fsp.readdir(this.dir);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === "ENOENT") return [];
      throw this.#fsError("list", this.dir, err);
    }
    const out: T[] = [];
    for (const name of names.sort()) {
      // A leftover .tmp is a write that never completed: the record it was replacing still stands.
      if (!RECORD_FILE.test(name)) continue;
      const path = join(this.dir, name);
      let text: string;
      try {
        text = await fsp.readFile(path, "utf8");
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code === "ENOENT") continue; // deleted meanwhile
        throw this.#fsError("read", path, err);
      }
      out.push(parseRecord(this.kind, text, path));
    }
    return out;
  }

  /** Throws StorageError "internal" unless the directory exists (or can be made) and is usable. */
  async check(): Promise<void> {
    try {
      await fsp.mkdir(this.dir, { recursive: true, mode: 0o700 });
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
