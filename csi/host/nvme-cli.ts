// The production NvmeInitiator: nvme-cli 2.x for connect, disconnect and list-subsys, sysfs (through
// HostFs) for namespace devices and rescans. Every command runs under a timeout.
import { createHash } from "node:crypto";
import { StorageError } from "../../lib/errors.ts";
import type { Exec } from "../../lib/exec.ts";
import type { HostFs } from "../../lib/fs.ts";
import type { KeyFiles } from "../../lib/key-files.ts";
import type { Logger } from "../../lib/log.ts";
import { parseListSubsys } from "./list-subsys.ts";
import type { ConnectedSubsystem, ConnectParams, NvmeInitiator } from "./nvme-initiator.ts";
import {
  CONTROLLER_CLASS,
  findNamespaceDisk,
  findSubsystemDir,
  SUBSYSTEM_CLASS,
  subsystemControllers,
} from "./nvme-sysfs.ts";

/**
 * The reconnect settings a connect may carry, in the order they are given: the `nvme connect`
 * option and the libnvme config.json port key of each. Note the spelling of --fast_io_fail_tmo:
 * nvme-cli names that one option with underscores (2.4 and later; 2.3 has no such option) and
 * rejects --fast-io-fail-tmo, while its neighbours are dashed.
 */
const RECONNECT_OPTIONS = [
  { param: "ctrlLossTmo", flag: "--ctrl-loss-tmo", key: "ctrl_loss_tmo" },
  { param: "reconnectDelay", flag: "--reconnect-delay", key: "reconnect_delay" },
  { param: "fastIoFailTmo", flag: "--fast_io_fail_tmo", key: "fast_io_fail_tmo" },
] as const;

/**
 * argv of `nvme connect` for `p`, exactly as nvme-cli 2.x parses it. The address goes as given:
 * nvme-cli and the kernel take IPv6 literals without brackets.
 */
export function connectArgv(p: ConnectParams): string[] {
  const argv = ["nvme", "connect", "-t", p.transport, "-a", p.address, "-s", String(p.port), "-n", p.nqn];
  argv.push("-q", p.hostNqn);
  for (const o of RECONNECT_OPTIONS) {
    const value = p[o.param];
    if (value !== undefined) argv.push(o.flag, String(value));
  }
  return argv;
}

/**
 * The nvme-cli JSON configuration (libnvme's config.json schema) that connects `p` with its
 * DH-HMAC-CHAP secrets: one host, one subsystem, one port carrying the secrets and the reconnect
 * settings. libnvme reads a port's "dhchap_key" as the host secret for that controller and its
 * "dhchap_ctrl_key" as the controller secret (json.c, json_parse_port), so nothing secret goes on
 * the command line. Only for keyed connects: `p.dhchap` or `p.tls` must be set.
 */
export function connectConfig(p: ConnectParams): string {
  const port: Record<string, string | number | boolean> = {
    transport: p.transport,
    traddr: p.address,
    trsvcid: String(p.port),
  };
  for (const o of RECONNECT_OPTIONS) {
    const value = p[o.param];
    if (value !== undefined) port[o.key] = value;
  }
  if (p.dhchap) {
    port.dhchap_key = p.dhchap.secret;
    if (p.dhchap.ctrlSecret !== undefined) port.dhchap_ctrl_key = p.dhchap.ctrlSecret;
  }
  // libnvme's port "tls" (a boolean option, json_update_attributes) and "tls_key" (the
  // interchange PSK, which libnvme imports into the kernel's .nvme keyring under the identity it
  // derives for this host and subsystem before it connects).
  if (p.tls) {
    port.tls = true;
    port.tls_key = p.tls.psk;
  }
  return `${JSON.stringify([{ hostnqn: p.hostNqn, subsystems: [{ nqn: p.nqn, ports: [port] }] }], null, 2)}\n`;
}

/**
 * argv of a keyed `nvme connect`: nvme-cli 2.11 and later connect every controller of the JSON
 * configuration given with --config/-J for the host NQN given with -q (fabrics.c,
 * nvme_connect_config), taking the secrets from that file. The path is all argv carries.
 */
export function keyedConnectArgv(configPath: string, hostNqn: string, tls = false): string[] {
  // --tls is a flag (no key): the PSK itself is in the configuration file.
  return ["nvme", "connect", "-J", configPath, "-q", hostNqn, ...(tls ? ["--tls"] : [])];
}

/** The configuration file's name for one connect: per subsystem and address, no secret in it. */
export function connectConfigName(p: ConnectParams): string {
  const id = createHash("sha256").update(`${p.nqn}\0${p.transport}\0${p.address}\0${p.port}`).digest("hex");
  return `connect-${id.slice(0, 24)}.json`;
}

/** argv of `nvme disconnect` for every controller of subsystem `nqn`. */
export function disconnectArgv(nqn: string): string[] {
  return ["nvme", "disconnect", "-n", nqn];
}

export const LIST_SUBSYS_ARGV: readonly string[] = ["nvme", "list-subsys", "-o", "json"];

export interface NvmeCliOptions {
  exec: Exec;
  /** Rooted at "/" in production; sysfs lives under it. */
  fs: HostFs;
  logger: Logger;
  /** Deadline of `nvme connect`, which waits for the fabric connect. Default 30 s. */
  connectTimeoutMs?: number;
  /** Deadline of every other nvme command. Default 15 s. */
  commandTimeoutMs?: number;
  /**
   * Where keyed connects write their nvme-cli configuration (0600, removed after the connect):
   * a directory on a memory filesystem only the node plugin can read. Without it a connect that
   * carries DH-HMAC-CHAP secrets is refused.
   */
  secretFiles?: KeyFiles;
}

/** An NvmeInitiator on nvme-cli; stateless, so one instance can serve all calls concurrently. */
export class NvmeCli implements NvmeInitiator {
  readonly #exec: Exec;
  readonly #fs: HostFs;
  readonly #log: Logger;
  readonly #connectMs: number;
  readonly #commandMs: number;
  readonly #secretFiles: KeyFiles | undefined;

  constructor(opts: NvmeCliOptions) {
    this.#exec = opts.exec;
    this.#fs = opts.fs;
    this.#log = opts.logger;
    this.#connectMs = opts.connectTimeoutMs ?? 30_000;
    this.#commandMs = opts.commandTimeoutMs ?? 15_000;
    this.#secretFiles = opts.secretFiles;
  }

  async connect(p: ConnectParams): Promise<void> {
    if (await this.#connectedAt(p)) return;
    const r = await this.#runConnect(p);
    if (r.code === 0) return;
    // nvme-cli 2.x exits non-zero with "already connected" (EALREADY) when a matching controller
    // exists; a concurrent connect can get there between our list and our connect.
    if (await this.#connectedAt(p)) return;
    throw new StorageError(
      "unavailable",
      `nvme connect to ${p.nqn} at ${p.transport}:${p.address}:${p.port} failed (exit ${r.code}): ${(r.stderr || r.stdout).trim().slice(0, 1000)}`,
      { details: { nqn: p.nqn, code: r.code } },
    );
  }

  /** Runs `nvme connect`; a keyed one through a configuration file that is removed afterwards. */
  async #runConnect(p: ConnectParams) {
    if (!p.dhchap && !p.tls) return this.#exec.run(connectArgv(p), { timeoutMs: this.#connectMs });
    if (!this.#secretFiles) {
      throw new StorageError(
        "precondition",
        `subsystem ${p.nqn} demands ${p.tls ? "TLS" : "DH-HMAC-CHAP"} and this node has no directory for nvme-cli's key configuration`,
      );
    }
    const name = connectConfigName(p);
    const path = await this.#secretFiles.write(name, connectConfig(p));
    try {
      return await this.#exec.run(keyedConnectArgv(path, p.hostNqn, p.tls !== undefined), {
        timeoutMs: this.#connectMs,
      });
    } finally {
      await this.#secretFiles.remove(name);
    }
  }

  async disconnect(nqn: string): Promise<void> {
    if (!(await this.#hasSubsystem(nqn))) return;
    const r = await this.#exec.run(disconnectArgv(nqn), { timeoutMs: this.#commandMs });
    if (r.code !== 0) {
      throw new StorageError(
        "internal",
        `nvme disconnect -n ${nqn} failed (exit ${r.code}): ${(r.stderr || r.stdout).trim().slice(0, 1000)}`,
        { details: { nqn, code: r.code } },
      );
    }
    // The kernel deletes controllers asynchronously; one that is still listed was not removed.
    if (await this.#hasSubsystem(nqn)) {
      throw new StorageError("unavailable", `subsystem ${nqn} still has controllers after nvme disconnect`, {
        details: { nqn },
      });
    }
    this.#log.info("nvme disconnected", { nqn });
  }

  async list(): Promise<ConnectedSubsystem[]> {
    const r = await this.#exec.run(LIST_SUBSYS_ARGV, { timeoutMs: this.#commandMs });
    if (r.code !== 0) {
      // Without the nvme modules there is no topology to scan and nvme-cli fails; nothing is connected.
      if (!(await this.#fs.exists(SUBSYSTEM_CLASS))) return [];
      throw new StorageError(
        "internal",
        `nvme list-subsys failed (exit ${r.code}): ${(r.stderr || r.stdout).trim().slice(0, 1000)}`,
      );
    }
    return parseListSubsys(r.stdout);
  }

  async findNamespaceDevice(nqn: string, namespaceId?: string): Promise<string | undefined> {
    const disk = await findNamespaceDisk(this.#fs, nqn, namespaceId);
    return disk === undefined ? undefined : `/dev/${disk}`;
  }

  async rescan(nqn: string): Promise<void> {
    const dir = await findSubsystemDir(this.#fs, nqn);
    const ctrls = dir === undefined ? [] : await subsystemControllers(this.#fs, dir);
    if (ctrls.length === 0)
      throw new StorageError("not-found", `subsystem ${nqn} has no controller to rescan`);
    for (const c of ctrls) await this.#fs.writeFile(`${CONTROLLER_CLASS}/${c}/rescan_controller`, "1");
  }

  async #connectedAt(p: ConnectParams): Promise<boolean> {
    const s = (await this.list()).find((x) => x.nqn === p.nqn);
    return (
      s?.paths.some(
        (path) =>
          path.transport === p.transport && path.traddr === p.address && path.trsvcid === String(p.port),
      ) ?? false
    );
  }

  async #hasSubsystem(nqn: string): Promise<boolean> {
    return (await this.list()).some((s) => s.nqn === nqn);
  }
}
