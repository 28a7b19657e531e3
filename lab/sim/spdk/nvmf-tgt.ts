// `nvmf_tgt` stand-in for the lab: accepts nvmf_tgt's command line (plus --sim-* options for the
// simulation), runs the emulator until SIGTERM/SIGINT or spdk_kill_instance, so a supervisor can
// spawn, probe and kill it like the real process.

import { readFileSync } from "node:fs";
import { isIP } from "node:net";
import { networkInterfaces } from "node:os";
import * as v from "valibot";
import { createLogger, type Logger } from "../../../lib/log.ts";
import { startSpdkEmulator } from "./emulator.ts";
import { createFabric, createTcpFabric } from "./fabric.ts";
import type { Trtype } from "./nvmf-target.ts";
import { type SimDrive, SimDriveSchema } from "./sim-drive.ts";

/** The parsed command line. */
export interface NvmfTgtArgs {
  readonly coreMask: string;
  readonly socketPath: string;
  readonly waitForRpc: boolean;
  readonly dataDir: string;
  readonly drivesFile: string | undefined;
  readonly fabricDir: string | undefined;
  /** --sim-fabric=tcp: listeners are real TCP sockets on their traddr (the real-cluster lab). */
  readonly tcpFabric?: boolean;
  readonly hostNqn: string | undefined;
  readonly transports: readonly Trtype[];
  /** --sim-host-addresses: the IP addresses the node has; undefined = any. */
  readonly hostAddresses?: readonly string[];
  /** --sim-rpc-poll-ms: the RPC poll period (default SPDK's 4 ms; 0 answers on arrival). */
  readonly rpcPollMs?: number;
  /** --sim-spdk-version: the release posed as (absent: the lab's default, 26.01). */
  readonly spdkVersion?: "25.05.1" | "26.01";
  /** --sim-nbd-dir: enables the nbd_* methods, their block files mounted here (SNAP's stand-in). */
  readonly nbdDir?: string;
  /** Real nvmf_tgt options accepted and ignored (memory, tracing, PCI filters...). */
  readonly ignored: readonly string[];
}

/** The help text (also printed with a usage error). */
export const USAGE = `usage: nvmf-tgt.ts [options]
  -m, --cpumask <mask>       core mask (hex, or a list like [0,2-3]); default 0x1
  -r, --rpc-socket <path>    RPC listen socket; default /var/tmp/spdk.sock
      --wait-for-rpc         wait for framework_start_init before initialising
  simulation:
      --sim-data-dir <dir>   drive backing files and lvol metadata (required)
      --sim-drives <file>    JSON array of drives: {pciAddress, serial, model, sizeBytes, ...}
      --sim-fabric-dir <dir> shared SimFabric directory (listeners and remote attaches)
      --sim-fabric tcp       the fabric over real TCP: listeners bind traddr:trsvcid
      --sim-host-nqn <nqn>   default host NQN of the initiator side
      --sim-transports <l>   comma list of built-in transports; default tcp,rdma
      --sim-rpc-poll-ms <ms> the RPC server's poll period; default 4 (SPDK's RPC_SELECT_INTERVAL),
                             0 answers every request on arrival
      --sim-spdk-version <v> 26.01 (default: TLS PSKs work) or 25.05.1 (the recorded release,
                             whose NULL HKDF salt fails every TLS PSK)
      --sim-host-addresses <l> comma list of the node's IP addresses, or auto (this network
                             namespace's own); listeners elsewhere are refused like a failed
                             bind(); default: any address
      --sim-nbd-dir <dir>    enable nbd_start_disk/nbd_stop_disk/nbd_get_disks: each exported
                             bdev is a FUSE file mounted on <dir> behind a loop device, whose
                             /dev/loopN stands in for /dev/nbdN (root and /dev/fuse); default off
  accepted and ignored: -s/--mem-size, -i/--shm-id, -e/--tpoint-group, -L/--logflag,
      -p/--main-core, -n/--mem-channels, --huge-dir, --iova-mode, --num-trace-entries,
      -A/--pci-allowed, -B/--pci-blocked, --no-huge, -R/--huge-unlink, -g/--single-file-segments,
      -u/--no-pci, --disable-cpumask-locks, --silence-noticelog, --interrupt-mode`;

const IGNORED_WITH_VALUE = new Set([
  "-s",
  "--mem-size",
  "-i",
  "--shm-id",
  "-e",
  "--tpoint-group",
  "-L",
  "--logflag",
  "-p",
  "--main-core",
  "-n",
  "--mem-channels",
  "--huge-dir",
  "--iova-mode",
  "--num-trace-entries",
  "-A",
  "--pci-allowed",
  "-B",
  "--pci-blocked",
]);
const IGNORED_FLAGS = new Set([
  "--no-huge",
  "-R",
  "--huge-unlink",
  "-g",
  "--single-file-segments",
  "-u",
  "--no-pci",
  "--disable-cpumask-locks",
  "--silence-noticelog",
  "--interrupt-mode",
]);

/** Thrown for a command line nvmf_tgt would reject; the message is for stderr. */
export class UsageError extends Error {}

/** Parses argv (without the program). Pure; UsageError on anything unknown or missing. */
export function parseArgs(argv: readonly string[]): NvmfTgtArgs | "help" {
  let coreMask = "0x1";
  let socketPath = "/var/tmp/spdk.sock";
  let waitForRpc = false;
  let dataDir: string | undefined;
  let drivesFile: string | undefined;
  let fabricDir: string | undefined;
  let tcpFabric = false;
  let hostNqn: string | undefined;
  let transports: Trtype[] = ["TCP", "RDMA"];
  let hostAddresses: string[] | undefined;
  let rpcPollMs: number | undefined;
  let spdkVersion: "25.05.1" | "26.01" | undefined;
  let nbdDir: string | undefined;
  const ignored: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    let arg = argv[i] as string;
    let inline: string | undefined;
    const eq = arg.startsWith("--") ? arg.indexOf("=") : -1;
    if (eq > 0) {
      inline = arg.slice(eq + 1);
      arg = arg.slice(0, eq);
    }
    const value = (): string => {
      if (inline !== undefined) return inline;
      const next = argv[++i];
      if (next === undefined) throw new UsageError(`option ${arg} needs a value`);
      return next;
    };
    switch (arg) {
      case "-h":
      case "--help":
        return "help";
      case "-m":
      case "--cpumask":
        coreMask = value();
        break;
      case "-r":
      case "--rpc-socket":
        socketPath = value();
        break;
      case "--wait-for-rpc":
        waitForRpc = true;
        break;
      case "--sim-data-dir":
        dataDir = value();
        break;
      case "--sim-drives":
        drivesFile = value();
        break;
      case "--sim-fabric-dir":
        fabricDir = value();
        break;
      case "--sim-fabric": {
        const kind = value();
        if (kind !== "tcp") throw new UsageError(`--sim-fabric takes tcp, got ${kind}`);
        tcpFabric = true;
        break;
      }
      case "--sim-host-nqn":
        hostNqn = value();
        break;
      case "--sim-transports":
        transports = value()
          .split(",")
          .map((t) => t.trim().toUpperCase())
          .map((t) => {
            if (t !== "TCP" && t !== "RDMA") throw new UsageError(`unknown transport ${t}`);
            return t;
          });
        break;
      case "--sim-host-addresses": {
        const raw = value();
        // auto: the addresses this process's network namespace really has (a lab node's own
        // netns, where the emulator runs with the host network), read once at start.
        hostAddresses =
          raw === "auto"
            ? Object.values(networkInterfaces()).flatMap((l) =>
                (l ?? []).map((i) => i.address.replace(/%.*$/, "")),
              )
            : raw
                .split(",")
                .map((a) => a.trim())
                .filter((a) => a !== "");
        if (hostAddresses.some((a) => isIP(a.replace(/^\[|\]$/g, "")) === 0)) {
          throw new UsageError(`--sim-host-addresses takes IP addresses, got ${hostAddresses.join(",")}`);
        }
        break;
      }
      case "--sim-spdk-version": {
        const raw = value().replace(/^v/, "");
        if (raw !== "25.05.1" && raw !== "26.01")
          throw new UsageError(`--sim-spdk-version takes 25.05.1 or 26.01, got ${raw}`);
        spdkVersion = raw;
        break;
      }
      case "--sim-rpc-poll-ms": {
        const raw = value();
        rpcPollMs = Number(raw);
        if (!/^\d+$/.test(raw) || rpcPollMs > 1000)
          throw new UsageError(`--sim-rpc-poll-ms takes whole milliseconds from 0 to 1000, got ${raw}`);
        break;
      }
      case "--sim-nbd-dir":
        nbdDir = value();
        if (nbdDir === "") throw new UsageError("--sim-nbd-dir needs a directory");
        break;
      default:
        if (IGNORED_WITH_VALUE.has(arg)) ignored.push(`${arg} ${value()}`);
        else if (IGNORED_FLAGS.has(arg)) ignored.push(arg);
        else throw new UsageError(`unsupported option ${arg}`);
    }
  }
  if (dataDir === undefined) throw new UsageError("--sim-data-dir is required");
  if (tcpFabric && fabricDir !== undefined) {
    throw new UsageError("--sim-fabric=tcp and --sim-fabric-dir are two fabrics: give one");
  }
  return {
    coreMask,
    socketPath,
    waitForRpc,
    dataDir,
    drivesFile,
    fabricDir,
    ...(tcpFabric ? { tcpFabric } : {}),
    hostNqn,
    transports,
    ...(hostAddresses ? { hostAddresses } : {}),
    ...(rpcPollMs === undefined ? {} : { rpcPollMs }),
    ...(spdkVersion === undefined ? {} : { spdkVersion }),
    ...(nbdDir === undefined ? {} : { nbdDir }),
    ignored,
  };
}

/** Reads and validates the drives file. */
export function loadDrives(path: string): SimDrive[] {
  const raw: unknown = JSON.parse(readFileSync(path, "utf8"));
  return v.parse(v.array(SimDriveSchema), raw);
}

/**
 * Runs the emulator for `args` until a signal or spdk_kill_instance, then resolves with the exit
 * code. `signals` lets tests avoid touching the real process's handlers.
 */
export async function run(
  args: NvmfTgtArgs,
  log: Logger,
  signals: { on(sig: "SIGTERM" | "SIGINT", fn: () => void): void },
): Promise<number> {
  if (args.ignored.length > 0)
    log.info("ignoring options without meaning in the simulation", { options: args.ignored });
  const emu = await startSpdkEmulator({
    socketPath: args.socketPath,
    coreMask: args.coreMask,
    waitForRpc: args.waitForRpc,
    dataDir: args.dataDir,
    drives: args.drivesFile ? loadDrives(args.drivesFile) : [],
    fabric: args.tcpFabric ? createTcpFabric() : args.fabricDir ? createFabric(args.fabricDir) : undefined,
    hostNqn: args.hostNqn,
    transports: args.transports,
    ...(args.hostAddresses ? { hostAddresses: args.hostAddresses } : {}),
    ...(args.rpcPollMs === undefined ? {} : { rpcPollMs: args.rpcPollMs }),
    // The lab's target carries the TLS-PSK salt fix unless told to pose as the recorded release.
    spdkVersion: args.spdkVersion ?? "26.01",
    ...(args.nbdDir === undefined ? {} : { nbdMountpoint: args.nbdDir }),
    logger: log,
  });
  return new Promise<number>((resolve) => {
    const stop = (sig: string) => {
      log.info("signal received, shutting down", { signal: sig });
      void emu.close().then(() => resolve(0));
    };
    signals.on("SIGTERM", () => stop("SIGTERM"));
    signals.on("SIGINT", () => stop("SIGINT"));
    emu.onExit((sig) => {
      void emu.close().then(() => resolve(0));
      log.info("stopped by spdk_kill_instance", { signal: sig });
    });
  });
}

if (import.meta.main) {
  const log = createLogger({ fields: { app: "nvmf_tgt-sim" } });
  let args: NvmfTgtArgs | "help";
  try {
    args = parseArgs(process.argv.slice(2));
  } catch (err) {
    process.stderr.write(`${(err as Error).message}\n${USAGE}\n`);
    process.exit(1);
  }
  if (args === "help") {
    process.stdout.write(`${USAGE}\n`);
    process.exit(0);
  }
  run(args, log, process).then(
    (code) => process.exit(code),
    (err: unknown) => {
      log.error("nvmf_tgt emulator failed", { err: String(err) });
      process.exit(1);
    },
  );
}
