// The lab initiator's durable state: one JSON file per connected subsystem (how it was connected,
// its namespaces and the loop devices standing in for them) plus the host ID, so a restarted node
// finds its connections as a real host finds its kernel's controllers.
import { randomUUID } from "node:crypto";
import { existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import * as v from "valibot";
import { StorageError } from "../../../lib/errors.ts";

const NamespaceSchema = v.object({
  nsid: v.number(),
  uuid: v.string(),
  nguid: v.string(),
  sizeBytes: v.number(),
  /** The loop device showing it. */
  device: v.pipe(v.string(), v.startsWith("/dev/loop")),
  backing: v.object({ path: v.string(), offset: v.number(), sizeBytes: v.number() }),
  /** Attached with --sizelimit (0 when the device follows the file's size). */
  sizeLimit: v.number(),
});

const ConnectionSchema = v.object({
  nqn: v.string(),
  hostNqn: v.string(),
  transport: v.picklist(["tcp", "rdma"]),
  traddr: v.string(),
  trsvcid: v.string(),
  ctrlLossTmo: v.optional(v.number()),
  reconnectDelay: v.optional(v.number()),
  fastIoFailTmo: v.optional(v.number()),
  /** nvme<instance> / nvme-subsys<instance>, as the kernel numbers controllers. */
  instance: v.number(),
  namespaces: v.array(NamespaceSchema),
});

export type SimNamespace = v.InferOutput<typeof NamespaceSchema>;
export type SimConnection = v.InferOutput<typeof ConnectionSchema>;

/**
 * Connections in `dir`, one file per subsystem (named by a hex encoding of the NQN). Writes are
 * atomic (temporary file, then rename). Synchronous, because the records are tiny and a
 * simulator values ordering over throughput. Callers serialise per NQN.
 */
export class ConnectionStore {
  constructor(readonly dir: string) {
    mkdirSync(dir, { recursive: true });
  }

  #file(nqn: string): string {
    return join(this.dir, `${Buffer.from(nqn).toString("hex")}.json`);
  }

  /** The host ID, created once like /etc/nvme/hostid. */
  hostId(): string {
    const path = join(this.dir, "hostid");
    if (!existsSync(path)) writeFileSync(path, `${randomUUID()}\n`);
    return readFileSync(path, "utf8").trim();
  }

  get(nqn: string): SimConnection | undefined {
    const path = this.#file(nqn);
    if (!existsSync(path)) return undefined;
    return this.#parse(path);
  }

  put(c: SimConnection): void {
    const path = this.#file(c.nqn);
    writeFileSync(`${path}.tmp`, `${JSON.stringify(c, null, 2)}\n`);
    renameSync(`${path}.tmp`, path);
  }

  delete(nqn: string): void {
    rmSync(this.#file(nqn), { force: true });
  }

  list(): SimConnection[] {
    return readdirSync(this.dir)
      .filter((n) => n.endsWith(".json"))
      .sort()
      .map((n) => this.#parse(join(this.dir, n)));
  }

  /** The lowest controller instance number no connection uses. */
  freeInstance(): number {
    const used = new Set(this.list().map((c) => c.instance));
    let i = 0;
    while (used.has(i)) i++;
    return i;
  }

  #parse(path: string): SimConnection {
    let raw: unknown;
    try {
      raw = JSON.parse(readFileSync(path, "utf8"));
    } catch (err) {
      throw new StorageError("internal", `lab connection record ${path} is not JSON`, { cause: err });
    }
    const r = v.safeParse(ConnectionSchema, raw);
    if (!r.success)
      throw new StorageError(
        "internal",
        `lab connection record ${path} is malformed: ${r.issues[0]?.message}`,
      );
    return r.output;
  }
}
