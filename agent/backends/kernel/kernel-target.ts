// The kernel NVMe-oF target backend: exports block devices through Linux nvmet by writing its
// configfs tree directly, reading every component back and repairing what differs on each call.

import { Mutex } from "../../../lib/concurrency/mutex.ts";
import { StorageError } from "../../../lib/errors.ts";
import type { Exec } from "../../../lib/exec.ts";
import type { HostFs } from "../../../lib/fs.ts";
import { type Logger, silentLogger } from "../../../lib/log.ts";
import {
  type DeviceRef,
  type ExportSpec,
  type ExportState,
  type HostKeys,
  hostKeyOf,
  type TargetBackend,
  TLS_UNSUPPORTED,
  type Transport,
} from "../types.ts";
import { addressFamily, serviceId } from "./address.ts";
import { ConfigfsIo, errnoOf } from "./configfs-io.ts";
import { findKernelDrive } from "./kernel-drive.ts";
import { validateNqn } from "./nqn.ts";
import { NVMET_ROOT, NvmetPaths } from "./nvmet-paths.ts";
import { choosePort, type Listener, type ObservedPort } from "./port-registry.ts";

export interface KernelTargetOptions {
  /** Host filesystem holding /sys (configfs and the nvme class); hostFs("/") in production. */
  fs: HostFs;
  /** Runs modprobe. */
  exec: Exec;
  log?: Logger;
  /** Where nvmet's configfs tree is; default /sys/kernel/config/nvmet. */
  nvmetRoot?: string;
  /** Transport modules prepareDevice loads up front (ensureExport loads its own anyway). Default ["rdma"]. */
  transports?: readonly Transport[];
  /**
   * nvmet's debugfs directory, where each live controller is <subnqn>/ctrl<cntlid>/hostnqn
   * (drivers/nvme/target/debugfs.c, CONFIG_NVME_TARGET_DEBUGFS). Default
   * /sys/kernel/debug/nvmet. When it is absent, controllers cannot be observed (see reconcileHosts).
   */
  debugfsRoot?: string;
  /** How long reconcileHosts waits for a fenced host's controllers to go. Default 10 s. */
  fenceTimeoutMs?: number;
}

const TRANSPORT_MODULE: Record<Transport, string> = { rdma: "nvmet-rdma", tcp: "nvmet-tcp" };
/** nvmet takes 1-20 printable ASCII bytes and pads with spaces, so edge spaces would not read back. */
const SERIAL = /^[\x21-\x7e](?:[\x20-\x7e]{0,18}[\x21-\x7e])?$/;
/** Every DISTORT export has exactly one namespace, number 1 (consumers build <ctrl>n1 from it). */
const NSID = "1";
/** NVMe DH-HMAC-CHAP secret representation (TP 8006): DHHC-1:<hash id>:<base64 key+crc>: */
const DHCHAP_SECRET = /^DHHC-1:0[0-3]:[A-Za-z0-9+/]{44,}={0,2}:$/;
/** Longest path the kernel accepts (PATH_MAX including the terminating NUL). */
const PATH_MAX = 4095;
/** Where nvmet's debugfs lists live controllers, when debugfs is mounted and the kernel has it. */
export const NVMET_DEBUGFS_ROOT = "/sys/kernel/debug/nvmet";
/** How often reconcileHosts looks again while a fenced host's controllers are going. */
const FENCE_POLL_MS = 50;

/** An ExportSpec after validation, in the words configfs uses. */
interface Desired {
  nqn: string;
  devicePath: string;
  serial: string;
  transport: Transport;
  listener: Listener;
}

/** A port as observed, with where each of its subsystem links points. */
interface PortView extends ObservedPort {
  /** link name -> absolute target path ("" when the entry is not a symlink). */
  targets: Map<string, string>;
}

/**
 * TargetBackend over Linux nvmet configfs.
 *
 * Layout written per export: subsystems/<nqn>/{attr_allow_any_host=0, attr_serial,
 * namespaces/1/{device_path, enable=1}, allowed_hosts/<host> -> hosts/<host>}, hosts/<host>/,
 * ports/<id>/{addr_trtype, addr_adrfam, addr_traddr, addr_trsvcid, subsystems/<nqn> -> subsystem}.
 * Port ids come from choosePort: one port per listener, shared between exports.
 *
 * Every method is idempotent and safe to repeat after a crash at any point: it reads what exists,
 * changes only what differs, and verifies each value it writes by reading it back. All methods of
 * one instance run one at a time (an instance per node; two instances over one configfs would
 * race). The kernel's ordering rules are kept: device_path before enable, disable before a new
 * device_path, port attributes before the first link (a linked port is enabled and read-only),
 * links removed before the directories they point to. Errors are StorageError: "invalid" for a bad
 * spec (nothing is written), "unavailable" for missing modules or a device nvmet cannot open (retry
 * later), "not-found" for setHosts on a missing subsystem, otherwise the mapped errno.
 */
export class KernelTarget implements TargetBackend {
  readonly name = "kernel" as const;
  readonly #io: ConfigfsIo;
  readonly #exec: Exec;
  readonly #log: Logger;
  readonly #p: NvmetPaths;
  readonly #transports: readonly Transport[];
  readonly #mutex = new Mutex();
  readonly #loaded = new Set<string>();
  readonly #debugfs: string;
  readonly #fenceTimeoutMs: number;

  constructor(opts: KernelTargetOptions) {
    this.#io = new ConfigfsIo(opts.fs);
    this.#exec = opts.exec;
    this.#log = (opts.log ?? silentLogger).with({ backend: "kernel" });
    this.#p = new NvmetPaths(opts.nvmetRoot ?? NVMET_ROOT);
    this.#transports = opts.transports ?? ["rdma"];
    this.#debugfs = (opts.debugfsRoot ?? NVMET_DEBUGFS_ROOT).replace(/\/+$/, "");
    this.#fenceTimeoutMs = opts.fenceTimeoutMs ?? 10_000;
  }

  /**
   * Verifies the nvme driver owns the drive (see findKernelDrive for the errors) and loads nvmet
   * plus the configured transport modules. Returns the device with blockDevice set to its
   * namespace 1. Idempotent; a modprobe failure is StorageError("unavailable").
   */
  async prepareDevice(device: DeviceRef): Promise<DeviceRef> {
    const drive = await findKernelDrive(this.#io.fs, device);
    await this.#mutex.run(() => this.#loadModules(this.#transports));
    return { ...device, blockDevice: drive.blockDevice };
  }

  /**
   * The export as configfs has it. `namespace` is namespace 1's device_path only while that
   * namespace is enabled (a disabled namespace exports nothing); listeners are the rdma/tcp ports
   * linking the subsystem; hosts are the allowed host NQNs, sorted. Read-only.
   */
  async inspectExport(nqn: string): Promise<ExportState | undefined> {
    validateNqn(nqn, "subsystem");
    return this.#mutex.run(async () => {
      const sub = this.#p.subsystem(nqn);
      if (!(await this.#io.isDir(sub))) return undefined;
      const ns = this.#p.namespace(nqn, NSID);
      const enabled = (await this.#io.readAttr(`${ns}/enable`)) === "1";
      const path = devicePath(await this.#io.readAttr(`${ns}/device_path`));
      const listeners: ExportState["listeners"] = [];
      for (const port of await this.#observePorts()) {
        if (![...port.targets.values()].includes(sub)) continue;
        if (port.trtype !== "rdma" && port.trtype !== "tcp") continue;
        listeners.push({ transport: port.trtype, address: port.traddr, port: Number(port.trsvcid) });
      }
      const hosts = [...(await this.#allowedHosts(nqn)).values()].filter((h): h is string => h !== undefined);
      const controllers = await this.#controllers(nqn);
      return {
        nqn,
        ...(enabled && path ? { namespace: path } : {}),
        listeners,
        hosts: [...new Set(hosts)].sort(),
        ...(controllers ? { connectedHosts: [...new Set(controllers.map((c) => c.hostnqn))].sort() } : {}),
      };
    });
  }

  /**
   * Makes subsystem, namespace 1 and the listener exactly `spec` (see the class comment), leaving the
   * host ACL to setHosts. Returns what it created or repaired: "subsystem", "namespace", "port",
   * "port-link" for components it had to create, "subsystem.allow_any_host", "subsystem.serial",
   * "namespace.device_path", "namespace.enable" for repaired attributes, "namespace:<n>.removed",
   * "port-link:<id>.removed" and "port:<id>.removed" for extra namespaces, listeners and the ports
   * they emptied. [] when exact.
   */
  async ensureExport(spec: ExportSpec): Promise<string[]> {
    // nvmet's TLS (port addr_tsas tls1.3) takes the PSK from the kernel's .nvme keyring, derived
    // and inserted by tlshd/nvme-cli for each host and subsystem, and the handshake is tlshd's.
    // DISTORT provisions neither, so a TLS export is refused rather than served in the clear.
    if (spec.tls) {
      throw new StorageError(
        "precondition",
        "TLS exports are not supported on the kernel backend: nvmet needs the PSK in the kernel's .nvme keyring and tlshd for the handshake, which DISTORT does not provision (docs/api.md, TLS)",
        { details: { reason: TLS_UNSUPPORTED } },
      );
    }
    const d = desired(spec);
    return this.#mutex.run(async () => {
      await this.#loadModules([d.transport]);
      const done: string[] = [];
      await this.#ensureSubsystem(d, done);
      await this.#ensureNamespace(d, done);
      await this.#ensureListener(d, done);
      if (done.length > 0) this.#log.info("kernel export reconciled", { nqn: d.nqn, changed: done });
      return done;
    });
  }

  /** TargetBackend.setHosts; see reconcileHosts. */
  async setHosts(nqn: string, hostNQNs: readonly string[], keys?: HostKeys): Promise<void> {
    await this.reconcileHosts(nqn, hostNQNs, keys);
  }

  /**
   * Makes subsystems/<nqn>/allowed_hosts exactly `hostNQNs` and fences every other host: closes
   * allow_any_host if it was open, revokes every other host first, ends the controllers revoked
   * hosts still hold, then links the missing ones (creating hosts/<nqn> as needed), then removes
   * host directories no subsystem links any more.
   *
   * Fencing. nvmet checks a host only at connect (nvmet_host_allowed): removing its allowed_hosts
   * link leaves its live controllers doing I/O (nvmet_allowed_hosts_drop_link touches none). What
   * ends them is unlinking the subsystem from a port (nvmet_port_subsys_drop_link ->
   * nvmet_port_del_ctrls), so the subsystem is unlinked from each of its ports and linked back;
   * hosts still allowed reconnect, the revoked ones are refused. Disabling the namespace instead
   * would not do: the controllers stay, and see the namespace again once it is re-enabled.
   * - With nvmet's debugfs (controllers listed as <subnqn>/ctrl<id>/hostnqn), the links are
   *   revoked first, the ports are bounced only when a controller of a host outside `hostNQNs` is
   *   listed, and the call returns only once none is listed any more (controller teardown is
   *   asynchronous in the kernel): StorageError("unavailable") past fenceTimeoutMs. A crash at
   *   any point is repaired by the next call, which sees the controller again.
   * - Without it the kernel shows no controllers at all, so whenever a host is revoked the ports
   *   are unlinked BEFORE the allowed_hosts links and relinked after: a crash in between leaves
   *   the subsystem unreachable (ensureExport relinks it) rather than a revoked host connected.
   *
   * Returns the changes made ("subsystem.allow_any_host", "revoke:<h>", "fence:port-<id>",
   * "host:<h>", "key:<h>", "allow:<h>", "host:<h>.removed"); [] when already exact.
   * StorageError("not-found") when the subsystem does not exist, StorageError("invalid") for a
   * malformed host NQN (nothing is changed then).
   */
  async reconcileHosts(nqn: string, hostNQNs: readonly string[], keys?: HostKeys): Promise<string[]> {
    for (const v of keys?.values() ?? []) {
      const k = hostKeyOf(v);
      for (const secret of [k.secret, ...(k.ctrlSecret === undefined ? [] : [k.ctrlSecret])]) {
        if (!DHCHAP_SECRET.test(secret))
          throw new StorageError(
            "invalid",
            "a DH-HMAC-CHAP secret must have the DHHC-1:<hash>:<base64>: form",
          );
      }
    }
    validateNqn(nqn, "subsystem");
    const want = new Set(hostNQNs.map((h) => validateNqn(h, "host")));
    const done: string[] = [];
    await this.#mutex.run(async () => {
      const sub = this.#p.subsystem(nqn);
      if (!(await this.#io.isDir(sub))) {
        throw new StorageError("not-found", `nvmet subsystem ${nqn} does not exist`, { details: { nqn } });
      }
      if ((await this.#io.readAttr(`${sub}/attr_allow_any_host`)) !== "0") {
        await this.#io.writeVerified(`${sub}/attr_allow_any_host`, "0");
        done.push("subsystem.allow_any_host");
      }
      await this.#io.mkdirIfMissing(this.#p.allowedHosts(nqn));
      const current = await this.#allowedHosts(nqn);
      const kept = new Set<string>();
      const revoke: string[] = [];
      for (const [link, host] of current) {
        // A link is right only when its name and its target are the wanted host; anything else goes.
        if (host !== undefined && host === link && want.has(host)) kept.add(host);
        else revoke.push(link);
      }
      const observable = await this.#io.isDir(this.#debugfs);
      const unlinked = !observable && revoke.length > 0 ? await this.#unlinkPorts(nqn, sub, done) : [];
      for (const link of revoke) {
        await this.#io.unlinkIfPresent(this.#p.allowedHost(nqn, link));
        done.push(`revoke:${link}`);
      }
      if (observable && (await this.#strangers(nqn, want)).length > 0) {
        await this.#relinkPorts(await this.#unlinkPorts(nqn, sub, done));
      } else {
        await this.#relinkPorts(unlinked);
      }
      for (const host of [...want].sort()) {
        // nvmet keeps the key on the host entry (shared by every subsystem that host may reach),
        // so it is written before the host is linked into this subsystem's ACL.
        const entry = keys?.get(host);
        if (entry !== undefined) {
          const k = hostKeyOf(entry);
          if (await this.#io.mkdirIfMissing(this.#p.host(host))) done.push(`host:${host}`);
          if ((await this.#io.readAttr(`${this.#p.host(host)}/dhchap_key`)) !== k.secret) {
            await this.#io.writeVerified(`${this.#p.host(host)}/dhchap_key`, k.secret);
            done.push(`key:${host}`);
          }
          // The controller key is what nvmet answers a host's challenge with (bidirectional). It
          // is only ever set, not cleared: a host that does not challenge never uses it, and the
          // host entry goes with its last subsystem.
          // The exchange's hash and group are the host entry's too (shared by its subsystems).
          const settings: [string, string | undefined][] = [
            ["dhchap_hash", k.hash === undefined ? undefined : `hmac(${k.hash})`],
            ["dhchap_dhgroup", k.dhgroup],
          ];
          for (const [attr, want] of settings) {
            if (want !== undefined && (await this.#io.readAttr(`${this.#p.host(host)}/${attr}`)) !== want) {
              await this.#io.writeVerified(`${this.#p.host(host)}/${attr}`, want);
              done.push(`${attr}:${host}`);
            }
          }
          const ctrl = k.ctrlSecret;
          if (
            ctrl !== undefined &&
            (await this.#io.readAttr(`${this.#p.host(host)}/dhchap_ctrl_key`)) !== ctrl
          ) {
            await this.#io.writeVerified(`${this.#p.host(host)}/dhchap_ctrl_key`, ctrl);
            done.push(`ctrl-key:${host}`);
          }
        }
        if (kept.has(host)) continue;
        if (await this.#io.mkdirIfMissing(this.#p.host(host))) done.push(`host:${host}`);
        await this.#io.symlink(this.#p.host(host), this.#p.allowedHost(nqn, host));
        done.push(`allow:${host}`);
      }
      done.push(...(await this.#collectHosts()));
      if (done.length > 0) this.#log.info("kernel host ACL reconciled", { nqn, changed: done });
    });
    // Outside the mutex: waiting for a teardown must not hold up the node's other exports.
    await this.#awaitFenced(nqn, want);
    return done;
  }

  /**
   * Controllers of `nqn` as debugfs lists them; undefined when nvmet's debugfs is not there (no
   * way to see controllers). A controller directory whose hostnqn vanished while being read has
   * just been freed and is skipped.
   */
  async #controllers(nqn: string): Promise<{ cntlid: string; hostnqn: string }[] | undefined> {
    if (!(await this.#io.isDir(this.#debugfs))) return undefined;
    const out: { cntlid: string; hostnqn: string }[] = [];
    const dir = `${this.#debugfs}/${nqn}`;
    for (const name of await this.#io.list(dir)) {
      if (!/^ctrl\d+$/.test(name)) continue;
      const hostnqn = await this.#io.readAttr(`${dir}/${name}/hostnqn`);
      if (hostnqn) out.push({ cntlid: name.slice(4), hostnqn });
    }
    return out;
  }

  /** Host NQNs outside `want` that still hold a controller of `nqn` (debugfs present). */
  async #strangers(nqn: string, want: ReadonlySet<string>): Promise<string[]> {
    const ctrls = (await this.#controllers(nqn)) ?? [];
    return [...new Set(ctrls.map((c) => c.hostnqn).filter((h) => !want.has(h)))].sort();
  }

  /** Waits until no host outside `want` holds a controller; a no-op when debugfs is absent. */
  async #awaitFenced(nqn: string, want: ReadonlySet<string>): Promise<void> {
    const deadline = Date.now() + this.#fenceTimeoutMs;
    for (;;) {
      const left = await this.#mutex.run(async () =>
        (await this.#io.isDir(this.#debugfs)) ? this.#strangers(nqn, want) : [],
      );
      if (left.length === 0) return;
      if (Date.now() >= deadline) {
        throw new StorageError(
          "unavailable",
          `nvmet still lists controllers of revoked host(s) ${left.join(", ")} on ${nqn} after ${this.#fenceTimeoutMs} ms`,
          { details: { nqn, hosts: left } },
        );
      }
      await new Promise((r) => setTimeout(r, FENCE_POLL_MS));
    }
  }

  /**
   * Unlinks the subsystem from every port that links it, which ends its controllers there
   * (nvmet_port_del_ctrls). Returns the links to restore. A port left without subsystems is
   * disabled by the kernel but kept here, so the relink finds its attributes.
   */
  async #unlinkPorts(nqn: string, sub: string, done: string[]): Promise<string[]> {
    const links: string[] = [];
    for (const port of await this.#observePorts()) {
      for (const [name, target] of port.targets) {
        if (name !== nqn || target !== sub) continue;
        const link = this.#p.portLink(port.id, name);
        if (await this.#io.unlinkIfPresent(link)) {
          links.push(link);
          done.push(`fence:port-${port.id}`);
        }
      }
    }
    return links;
  }

  async #relinkPorts(links: readonly string[]): Promise<void> {
    for (const link of links) {
      const nqn = link.slice(link.lastIndexOf("/") + 1);
      await this.#io.symlink(this.#p.subsystem(nqn), link);
    }
  }

  /**
   * Removes the export in the reverse order of creation: host links, port links (and ports left
   * with no subsystem), namespaces (disabled first), the subsystem, then unreferenced host
   * directories. A missing export, or a partly removed one, counts as done.
   */
  async removeExport(nqn: string): Promise<void> {
    validateNqn(nqn, "subsystem");
    await this.#mutex.run(async () => {
      const sub = this.#p.subsystem(nqn);
      const done: string[] = [];
      for (const link of await this.#io.list(this.#p.allowedHosts(nqn))) {
        if (await this.#io.unlinkIfPresent(this.#p.allowedHost(nqn, link))) done.push(`revoke:${link}`);
      }
      for (const port of await this.#observePorts()) {
        done.push(...(await this.#unlinkFromPort(port, nqn, sub)));
      }
      // A crash between unlinking a port's last subsystem and removing the port leaves it empty;
      // an empty port listens to nothing and belongs to no export, so any removal collects it.
      for (const port of await this.#observePorts()) {
        if (port.links === 0 && (await this.#removePort(port.id))) done.push(`port:${port.id}.removed`);
      }
      for (const nsid of await this.#io.list(this.#p.namespaces(nqn))) {
        await this.#removeNamespace(nqn, nsid);
        done.push(`namespace:${nsid}.removed`);
      }
      if (await this.#io.rmdirIfPresent(sub)) done.push("subsystem.removed");
      done.push(...(await this.#collectHosts()));
      if (done.length > 0) this.#log.info("kernel export removed", { nqn, changed: done });
    });
  }

  // --- steps; each runs under the mutex ---

  async #loadModules(transports: readonly Transport[]): Promise<void> {
    for (const mod of ["nvmet", ...transports.map((t) => TRANSPORT_MODULE[t])]) {
      if (this.#loaded.has(mod)) continue;
      const r = await this.#exec.run(["modprobe", mod], { timeoutMs: 30_000 });
      if (r.code !== 0) {
        throw new StorageError(
          "unavailable",
          `modprobe ${mod} exited ${r.code}: ${(r.stderr || r.stdout).trim()}`,
          {
            details: { module: mod, code: r.code },
          },
        );
      }
      this.#loaded.add(mod);
    }
    if (!(await this.#io.isDir(this.#p.root))) {
      throw new StorageError(
        "unavailable",
        `${this.#p.root} does not exist: is configfs mounted at /sys/kernel/config?`,
      );
    }
  }

  async #ensureSubsystem(d: Desired, done: string[]): Promise<void> {
    const sub = this.#p.subsystem(d.nqn);
    const created = await this.#io.mkdirIfMissing(sub);
    if (created) done.push("subsystem");
    // First, so no later failure can leave a subsystem open to every host.
    if ((await this.#io.readAttr(`${sub}/attr_allow_any_host`)) !== "0") {
      if (!created) this.#log.warn("nvmet subsystem allowed any host; closing it", { nqn: d.nqn });
      await this.#io.writeVerified(`${sub}/attr_allow_any_host`, "0");
      if (!created) done.push("subsystem.allow_any_host");
    }
    if ((await this.#io.readAttr(`${sub}/attr_serial`)) !== d.serial) {
      try {
        await this.#io.writeVerified(`${sub}/attr_serial`, d.serial);
      } catch (err) {
        if (errnoOf((err as StorageError).cause) !== "EINVAL") throw err;
        throw new StorageError(
          "precondition",
          `nvmet refuses a new serial for ${d.nqn}: a host has already identified the subsystem; remove the export to re-create it`,
          { cause: err, details: { nqn: d.nqn } },
        );
      }
      if (!created) done.push("subsystem.serial");
    }
  }

  async #ensureNamespace(d: Desired, done: string[]): Promise<void> {
    // A default group that configfs creates with the subsystem; mkdir only happens in a plain tree.
    await this.#io.mkdirIfMissing(this.#p.namespaces(d.nqn));
    const ns = this.#p.namespace(d.nqn, NSID);
    const created = await this.#io.mkdirIfMissing(ns);
    if (created) done.push("namespace");
    const wasEnabled = (await this.#io.readAttr(`${ns}/enable`)) === "1";
    let enabled = wasEnabled;
    if (devicePath(await this.#io.readAttr(`${ns}/device_path`)) !== d.devicePath) {
      // nvmet refuses (EBUSY) to change the backing device of an enabled namespace.
      if (enabled) {
        await this.#io.writeVerified(`${ns}/enable`, "0");
        enabled = false;
      }
      await this.#io.writeVerified(`${ns}/device_path`, d.devicePath);
      if (!created) done.push("namespace.device_path");
    }
    if (!enabled) {
      await this.#enableNamespace(ns, d.devicePath);
      if (!created && !wasEnabled) done.push("namespace.enable");
    }
    for (const nsid of await this.#io.list(this.#p.namespaces(d.nqn))) {
      if (nsid === NSID) continue;
      await this.#removeNamespace(d.nqn, nsid);
      done.push(`namespace:${nsid}.removed`);
    }
  }

  async #enableNamespace(ns: string, path: string): Promise<void> {
    try {
      await this.#io.write(`${ns}/enable`, "1");
    } catch (err) {
      const code = errnoOf((err as StorageError).cause);
      if (code === "ENOENT" || code === "ENXIO" || code === "ENODEV" || code === "ENOTBLK") {
        throw new StorageError(
          "unavailable",
          `nvmet cannot open ${path} (${code}); the partition may not be there yet`,
          {
            cause: err,
            details: { path, errno: code },
          },
        );
      }
      throw err;
    }
    const got = await this.#io.readAttr(`${ns}/enable`);
    if (got !== "1")
      throw new StorageError("internal", `${ns}/enable reads ${JSON.stringify(got)} after enabling`);
  }

  async #removeNamespace(nqn: string, nsid: string): Promise<void> {
    const ns = this.#p.namespace(nqn, nsid);
    if ((await this.#io.readAttr(`${ns}/enable`)) === "1") await this.#io.write(`${ns}/enable`, "0");
    await this.#io.rmdirIfPresent(ns);
  }

  async #ensureListener(d: Desired, done: string[]): Promise<void> {
    const ports = await this.#observePorts();
    const choice = choosePort(ports, d.listener);
    const id = choice.id;
    if (choice.action !== "reuse") {
      await this.#io.mkdirIfMissing(this.#p.port(id));
      await this.#io.mkdirIfMissing(this.#p.portSubsystems(id));
      // Attributes are writable only while the port has no subsystem linked (nvmet: EACCES).
      const dir = this.#p.port(id);
      await this.#io.writeVerified(`${dir}/addr_trtype`, d.listener.trtype);
      await this.#io.writeVerified(`${dir}/addr_adrfam`, d.listener.adrfam);
      await this.#io.writeVerified(`${dir}/addr_traddr`, d.listener.traddr);
      await this.#io.writeVerified(`${dir}/addr_trsvcid`, d.listener.trsvcid);
      done.push("port");
    }
    const sub = this.#p.subsystem(d.nqn);
    const link = this.#p.portLink(id, d.nqn);
    const target = await this.#io.linkTarget(link);
    if (target !== sub) {
      if (target !== undefined) await this.#io.unlinkIfPresent(link);
      await this.#io.symlink(sub, link);
      done.push("port-link");
    }
    // Exactly one listener: a link from any other port is stale (an old address or port).
    for (const port of ports) {
      if (port.id !== id) done.push(...(await this.#unlinkFromPort(port, d.nqn, sub)));
    }
  }

  /** Unlinks the subsystem from `port`; removes the port when that was its last subsystem. */
  async #unlinkFromPort(port: PortView, nqn: string, sub: string): Promise<string[]> {
    const done: string[] = [];
    for (const [name, target] of port.targets) {
      if (name !== nqn && target !== sub) continue;
      if (await this.#io.unlinkIfPresent(`${this.#p.portSubsystems(port.id)}/${name}`)) {
        done.push(`port-link:${port.id}.removed`);
      }
    }
    if (done.length === 0) return done;
    if (
      (await this.#io.list(this.#p.portSubsystems(port.id))).length === 0 &&
      (await this.#removePort(port.id))
    ) {
      done.push(`port:${port.id}.removed`);
    }
    return done;
  }

  /** Removes a port that has no subsystem linked; true when it did. */
  async #removePort(id: number): Promise<boolean> {
    try {
      return await this.#io.rmdirIfPresent(this.#p.port(id));
    } catch (err) {
      if (errnoOf((err as StorageError).cause) !== "ENOTEMPTY") throw err;
      // Referrals or ANA groups someone made keep the port; with no subsystem it is disabled and harmless.
      this.#log.warn("kept an nvmet port with no subsystems", { port: id, error: (err as Error).message });
      return false;
    }
  }

  async #observePorts(): Promise<PortView[]> {
    const out: PortView[] = [];
    for (const name of await this.#io.list(this.#p.ports)) {
      if (!/^\d+$/.test(name)) continue;
      const dir = this.#p.port(name);
      const targets = new Map<string, string>();
      for (const link of await this.#io.list(this.#p.portSubsystems(name))) {
        targets.set(link, (await this.#io.linkTarget(`${this.#p.portSubsystems(name)}/${link}`)) ?? "");
      }
      out.push({
        id: Number(name),
        trtype: (await this.#io.readAttr(`${dir}/addr_trtype`)) ?? "",
        adrfam: (await this.#io.readAttr(`${dir}/addr_adrfam`)) ?? "",
        traddr: (await this.#io.readAttr(`${dir}/addr_traddr`)) ?? "",
        trsvcid: (await this.#io.readAttr(`${dir}/addr_trsvcid`)) ?? "",
        links: targets.size,
        targets,
      });
    }
    return out;
  }

  /** allowed_hosts link name -> host NQN it points to (undefined when it points elsewhere). */
  async #allowedHosts(nqn: string): Promise<Map<string, string | undefined>> {
    const out = new Map<string, string | undefined>();
    for (const link of await this.#io.list(this.#p.allowedHosts(nqn))) {
      const target = await this.#io.linkTarget(this.#p.allowedHost(nqn, link));
      const prefix = `${this.#p.hosts}/`;
      const host = target?.startsWith(prefix) ? target.slice(prefix.length) : undefined;
      out.set(link, host && !host.includes("/") ? host : undefined);
    }
    return out;
  }

  /** Removes hosts/<h> directories that no subsystem's allowed_hosts links to. */
  async #collectHosts(): Promise<string[]> {
    const referenced = new Set<string>();
    for (const nqn of await this.#io.list(this.#p.subsystems)) {
      for (const [link, host] of await this.#allowedHosts(nqn)) {
        referenced.add(link);
        if (host) referenced.add(host);
      }
    }
    const done: string[] = [];
    for (const host of await this.#io.list(this.#p.hosts)) {
      if (referenced.has(host)) continue;
      if (await this.#io.rmdirIfPresent(this.#p.host(host))) done.push(`host:${host}.removed`);
    }
    return done;
  }
}

/** nvmet shows an unset device_path as "(null)" (a NULL string printed with %s). */
function devicePath(shown: string | undefined): string {
  return shown === undefined || shown === "(null)" ? "" : shown;
}

/** Validates an ExportSpec into configfs values; StorageError("invalid") before any write. */
function desired(spec: ExportSpec): Desired {
  const bad = (msg: string): never => {
    throw new StorageError("invalid", `export ${spec.nqn}: ${msg}`, { details: { nqn: spec.nqn } });
  };
  const nqn = validateNqn(spec.nqn, "subsystem");
  const path = spec.volume?.backendPath;
  if (typeof path !== "string" || !path.startsWith("/") || /[\n\0]/.test(path)) {
    bad(`backendPath ${JSON.stringify(path)} is not an absolute device path`);
  }
  if (new TextEncoder().encode(path).length > PATH_MAX) bad("backendPath is longer than PATH_MAX");
  if (typeof spec.serialNumber !== "string" || !SERIAL.test(spec.serialNumber)) {
    bad(`serial number ${JSON.stringify(spec.serialNumber)} is not 1-20 printable ASCII characters`);
  }
  if (!Object.hasOwn(TRANSPORT_MODULE, spec.transport))
    bad(`unknown transport ${JSON.stringify(spec.transport)}`);
  return {
    nqn,
    devicePath: path,
    serial: spec.serialNumber,
    transport: spec.transport,
    listener: {
      trtype: spec.transport,
      adrfam: addressFamily(spec.address),
      traddr: spec.address,
      trsvcid: serviceId(spec.port),
    },
  };
}
