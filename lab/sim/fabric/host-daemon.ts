// The lab consumer node's "kernel" NVMe-oF host: one process per node that owns the FUSE mount of
// namespace files, the fabric controllers and the loop devices, and serves the control socket the
// CSI node's initiator talks to. Killing or restarting the CSI node does not touch its I/O.
// Usage: bun lab/sim/fabric/host-daemon.ts (--fabric-dir=DIR | --fabric=tcp) --state-dir=DIR --socket=PATH
//        [--kato-ms=N] [--log-level=info]
import { randomUUID } from "node:crypto";
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { errorMessage } from "../../../lib/errors.ts";
import { hostExec } from "../../../lib/exec.ts";
import { createLogger } from "../../../lib/log.ts";
import { stopOnSignals } from "../../../lib/signals.ts";
import { mountBlockFiles } from "../fuse/block-files.ts";
import { detachLoopsUnder } from "../fuse/leftover-loops.ts";
import { createFabric, createTcpFabric } from "../spdk/fabric.ts";
import { serveHostControl } from "./host-control.ts";
import { NvmeHost } from "./nvme-host.ts";

export interface HostDaemonArgs {
  /** The unix-socket fabric's directory, or "tcp" for the fabric over real TCP (--fabric=tcp). */
  fabric: { dir: string } | "tcp";
  stateDir: string;
  socket: string;
  katoMs: number | undefined;
  logLevel: "debug" | "info" | "warn" | "error";
}

/** Parses the daemon's flags; throws with the offending flag on anything else. */
export function parseHostDaemonArgs(argv: readonly string[]): HostDaemonArgs {
  const got = new Map<string, string>();
  for (const a of argv) {
    const m = /^--([a-z-]+)=(.*)$/.exec(a);
    if (!m) throw new Error(`unknown argument ${a}`);
    got.set(m[1] as string, m[2] as string);
  }
  const need = (k: string) => {
    const x = got.get(k);
    if (!x) throw new Error(`--${k} is required`);
    return x;
  };
  const level = got.get("log-level") ?? "info";
  if (!["debug", "info", "warn", "error"].includes(level)) throw new Error(`bad --log-level ${level}`);
  const kato = got.get("kato-ms");
  if (kato !== undefined && !/^\d+$/.test(kato)) throw new Error(`bad --kato-ms ${kato}`);
  for (const k of got.keys())
    if (!["fabric-dir", "fabric", "state-dir", "socket", "kato-ms", "log-level"].includes(k))
      throw new Error(`unknown flag --${k}`);
  const kind = got.get("fabric");
  if (kind !== undefined && kind !== "tcp") throw new Error(`--fabric takes tcp, got ${kind}`);
  if (kind !== undefined && got.has("fabric-dir"))
    throw new Error("give --fabric=tcp or --fabric-dir, not both");
  return {
    fabric: kind === "tcp" ? "tcp" : { dir: need("fabric-dir") },
    stateDir: need("state-dir"),
    socket: need("socket"),
    katoMs: kato === undefined ? undefined : Number(kato),
    logLevel: level as HostDaemonArgs["logLevel"],
  };
}

/** The host ID, created once in `dir` like /etc/nvme/hostid. */
function hostId(dir: string): string {
  const path = join(dir, "hostid");
  if (!existsSync(path)) writeFileSync(path, `${randomUUID()}\n`);
  return readFileSync(path, "utf8").trim();
}

if (import.meta.main) {
  let args: HostDaemonArgs;
  try {
    args = parseHostDaemonArgs(process.argv.slice(2));
  } catch (err) {
    process.stderr.write(`host-daemon: ${errorMessage(err)}\n`);
    process.exit(2);
  }
  const log = createLogger({ level: args.logLevel, fields: { component: "nvme-host-daemon" } });
  try {
    mkdirSync(args.stateDir, { recursive: true });
    const mountpoint = join(args.stateDir, "fuse");
    mkdirSync(mountpoint, { recursive: true });
    // A mount the previous incarnation left (outside a private mount namespace) goes first.
    Bun.spawnSync(["umount", "-l", mountpoint]);
    await detachLoopsUnder(hostExec, mountpoint, log);
    const files = await mountBlockFiles({ mountpoint, logger: log });
    const host = new NvmeHost({
      fabric: args.fabric === "tcp" ? createTcpFabric() : createFabric(args.fabric.dir),
      files,
      exec: hostExec,
      hostId: hostId(args.stateDir),
      logger: log,
      ...(args.katoMs === undefined ? {} : { katoMs: args.katoMs }),
    });
    const control = await serveHostControl(args.socket, host);
    log.info("nvme host ready", { socket: args.socket, mountpoint });
    stopOnSignals(log, "nvme host", async () => {
      await control.close();
      await host.close();
      await files.close();
    });
  } catch (err) {
    log.error("nvme host failed to start", { err: errorMessage(err) });
    process.exit(1);
  }
}
