// The lab's nvmf_tgt emulator with an RPC meter for the benches: every request its RPC server
// dispatches is counted by method, and by the NQN its params name, into a JSON file the bench reads.
// Run: bun bench/counting-nvmf-tgt.ts --count-file <path> <nvmf_tgt arguments>
import { renameSync, writeFileSync } from "node:fs";
import type { MethodSpec } from "../lab/sim/spdk/method-table.ts";
import { parseArgs, run } from "../lab/sim/spdk/nvmf-tgt.ts";
import { RpcServer } from "../lab/sim/spdk/rpc-server.ts";
import { createLogger } from "../lib/log.ts";

/** What the meter writes: totals since the process started. */
export interface RpcCounts {
  pid: number;
  /** Requests dispatched (unknown methods and wrong-state calls included). */
  total: number;
  byMethod: Record<string, number>;
  /** Requests whose params carry an `nqn`, by that NQN. */
  byNqn: Record<string, number>;
}

/** Reads the meter's file; undefined while it does not exist or is being replaced. */
export async function readCounts(path: string): Promise<RpcCounts | undefined> {
  try {
    return (await Bun.file(path).json()) as RpcCounts;
  } catch {
    return undefined;
  }
}

const FLUSH_MS = 200;

/**
 * Wraps the methods table of every RpcServer this process starts so each dispatch is counted, and
 * writes the counts to `file` (atomically, by rename) every FLUSH_MS while they change.
 */
function meter(file: string): void {
  const counts: RpcCounts = { pid: process.pid, total: 0, byMethod: {}, byNqn: {} };
  let dirty = true;
  const metered = new WeakSet<object>();
  const start = RpcServer.prototype.start;
  RpcServer.prototype.start = function (this: RpcServer): Promise<void> {
    const table = this.opts.methods as Map<string, MethodSpec>;
    if (metered.has(table)) return start.call(this);
    metered.add(table);
    const get = table.get.bind(table);
    table.get = (method: string) => {
      counts.total++;
      counts.byMethod[method] = (counts.byMethod[method] ?? 0) + 1;
      dirty = true;
      const spec = get(method);
      if (!spec) return spec;
      return {
        ...spec,
        handler: (req, ctx) => {
          const p = req.params;
          const nqn = p && typeof p === "object" && !Array.isArray(p) ? p.nqn : undefined;
          if (typeof nqn === "string") counts.byNqn[nqn] = (counts.byNqn[nqn] ?? 0) + 1;
          return spec.handler(req, ctx);
        },
      };
    };
    return start.call(this);
  };
  const flush = () => {
    if (!dirty) return;
    dirty = false;
    writeFileSync(`${file}.tmp`, JSON.stringify(counts));
    renameSync(`${file}.tmp`, file);
  };
  setInterval(flush, FLUSH_MS).unref();
  process.on("exit", flush);
}

if (import.meta.main) {
  const argv = process.argv.slice(2);
  const at = argv.indexOf("--count-file");
  const file = at >= 0 ? argv[at + 1] : undefined;
  if (file === undefined) {
    process.stderr.write("usage: counting-nvmf-tgt.ts --count-file <path> <nvmf_tgt arguments>\n");
    process.exit(1);
  }
  argv.splice(at, 2);
  const args = parseArgs(argv);
  if (args === "help") process.exit(0);
  meter(file);
  const log = createLogger({ fields: { app: "nvmf_tgt-sim" } });
  process.exit(await run(args, log, process));
}
