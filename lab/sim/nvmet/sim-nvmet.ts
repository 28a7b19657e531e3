// A simulated Linux nvmet target: serves the SimFabric from the configfs tree the agent writes
// (ports, subsystems, namespaces, allowed hosts, host keys) and does the block I/O on each
// namespace's device_path, with the kernel's semantics (drivers/nvme/target/configfs.c, core.c,
// fabrics-cmd.c) and its debugfs view of live controllers (debugfs.c).
//
// Kernel behaviour reproduced:
// - A port listens while at least one subsystem is linked (nvmet_enable_port on the first link,
//   nvmet_disable_port after the last); only tcp and rdma ports reach the fabric.
// - CONNECT looks the subsystem up among those linked to the port it arrived on
//   (nvmet_find_get_subsys) and checks the host there and then (nvmet_host_allowed); a host
//   linked in allowed_hosts whose entry carries a dhchap_key must first pass DH-HMAC-CHAP
//   (nvmet_setup_auth; fabric-auth.ts), with the one hash and DH group its entry names.
// - Unlinking a subsystem from a port ends that subsystem's controllers on that port
//   (nvmet_port_subsys_drop_link -> nvmet_port_del_ctrls); removing a subsystem ends all of its
//   controllers (nvmet_subsys_release -> nvmet_subsys_del_ctrls).
// - Removing an allowed_hosts link changes nothing for live controllers
//   (nvmet_allowed_hosts_drop_link only updates the list and the discovery log).
// - A disabled or removed namespace fails I/O addressed to it (no namespace: Invalid Namespace),
//   and connected hosts are told the namespace list changed (the AEN nvmet_ns_changed sends).
// - debugfs: nvmet/<subnqn>/ctrl<cntlid>/{port,hostnqn,kato,state,host_traddr} per live
//   controller, gone when the controller is freed.
//
// How changes are noticed: the kernel runs nvmet's callbacks inside the configfs syscall, so
// rescan() is meant to be called from the simulated configfs's onChange hook (the syscall does not
// return before nvmet has acted). A periodic rescan (watchIntervalMs) is the backstop for a
// writer that cannot notify (a plain directory written by another process). Each rescan reads
// the whole tree and applies the difference, so a missed or repeated notice is harmless.
import { type FileHandle, mkdir, open, readFile, realpath, rm, stat, writeFile } from "node:fs/promises";
import { basename, join } from "node:path";
import { Mutex } from "../../../lib/concurrency/mutex.ts";
import { type Logger, silentLogger } from "../../../lib/log.ts";
import type { FabricListener, FabricServerConnection, SimFabric } from "../spdk/fabric.ts";
import {
  nvmetAuthPolicy,
  serveAuthFrame,
  type TargetAuthPolicy,
  TargetAuthSession,
} from "../spdk/fabric-auth.ts";
import type { Message, NamespaceInfo } from "../spdk/fabric-protocol.ts";
import {
  type HostState,
  hostAllowed,
  type NamespaceState,
  type NvmetState,
  readNvmetTree,
  type SubsystemState,
} from "./nvmet-tree.ts";

/** The CONNECT a host sent. */
export type ConnectMessage = Extract<Message, { op: "connect" }>;

export interface SimNvmetOptions {
  /** The real directory holding configfs's nvmet tree (<sim root>/sys/kernel/config/nvmet). */
  nvmetDir: string;
  fabric: SimFabric;
  /** The real directory standing for /sys/kernel/debug/nvmet; none written when absent. */
  debugfsDir?: string;
  /** Maps a namespace's device_path (a host path) to the file to open. Default: the path itself. */
  resolveDevice?: (devicePath: string) => string;
  /** Rescan the tree this often as a backstop (ms); 0 or absent: only on rescan(). */
  watchIntervalMs?: number;
  log?: Logger;
}

/** A live controller, as debugfs shows it. */
export interface NvmetController {
  readonly subnqn: string;
  readonly cntlid: number;
  readonly hostnqn: string;
  readonly portId: string;
  readonly hostTraddr: string;
}

interface Ctrl extends NvmetController {
  /** The admin queue's connection; the controller lives as long as it does. */
  readonly conn: FabricServerConnection;
  /** I/O queues joined to this controller (nvmet_install_queue). */
  readonly ioConns: Set<FabricServerConnection>;
  /** Keep Alive Timeout in ms from the admin CONNECT; 0: none. */
  readonly kato: number;
  /** Last command or keep-alive seen on any queue (traffic-based keep-alive, ctrl->reset_tbkas). */
  lastTraffic: number;
  deleted: boolean;
}

/** An enabled namespace with its backing file open. */
interface OpenNs {
  readonly state: NamespaceState;
  readonly file: FileHandle;
  readonly sizeBytes: number;
}

/** The authentication state of one connection. */
interface AuthSlot {
  session?: TargetAuthSession;
}

const HASH_IDS: Record<string, 1 | 2 | 3> = { "hmac(sha256)": 1, "hmac(sha384)": 2, "hmac(sha512)": 3 };
const DHGROUP_IDS: Record<string, 0 | 1 | 2 | 3 | 4 | 5> = {
  null: 0,
  ffdhe2048: 1,
  ffdhe3072: 2,
  ffdhe4096: 3,
  ffdhe6144: 4,
  ffdhe8192: 5,
};

/** nvmet's choice for a host entry's dhchap_hash and dhchap_dhgroup (defaults hmac(sha256), null). */
function hostAuthPolicy(host: HostState): TargetAuthPolicy {
  return nvmetAuthPolicy(HASH_IDS[host.dhchapHash] ?? 1, DHGROUP_IDS[host.dhchapDhgroup] ?? 0);
}

const BLOCK = 512;
const EOPNOTSUPP = 95;
const FABRIC_TRTYPE: Record<string, string> = { tcp: "TCP", rdma: "RDMA" };
/** What Write Zeroes writes, a MiB at a time. */
const ZEROS = Buffer.alloc(1024 * 1024);

/** Starts a simulated nvmet over the tree at opts.nvmetDir; the first scan is done on return. */
export async function startSimNvmet(opts: SimNvmetOptions): Promise<SimNvmet> {
  const t = new SimNvmet(opts);
  await t.rescan();
  t.startWatching();
  return t;
}

export class SimNvmet {
  readonly #o: SimNvmetOptions;
  readonly #log: Logger;
  readonly #lock = new Mutex();
  #state: NvmetState = { ports: new Map(), subsystems: new Map(), hosts: new Map() };
  readonly #listeners = new Map<string, FabricListener>();
  readonly #open = new Map<string, Map<number, OpenNs>>();
  readonly #ctrls = new Set<Ctrl>();
  #timer: ReturnType<typeof setInterval> | undefined;
  #closed = false;

  constructor(opts: SimNvmetOptions) {
    this.#o = opts;
    this.#log = (opts.log ?? silentLogger).with({ sim: "nvmet" });
  }

  /** @internal Starts the backstop rescan timer (startSimNvmet does). */
  startWatching(): void {
    const ms = this.#o.watchIntervalMs ?? 0;
    if (ms > 0 && !this.#timer) {
      this.#timer = setInterval(() => {
        this.rescan().catch((err) => this.#log.warn("nvmet rescan failed", { error: String(err) }));
      }, ms);
      this.#timer.unref?.();
    }
  }

  /** Live controllers, oldest first. */
  controllers(): NvmetController[] {
    return [...this.#ctrls]
      .filter((c) => !c.deleted)
      .map(({ subnqn, cntlid, hostnqn, portId, hostTraddr }) => ({
        subnqn,
        cntlid,
        hostnqn,
        portId,
        hostTraddr,
      }));
  }

  /**
   * Reads the tree and applies what changed, in the kernel's order: controllers of unlinked
   * subsystems and removed subsystems end first, then namespaces close or open, then ports stop
   * or start listening. Serialised; safe to call any number of times.
   */
  rescan(): Promise<void> {
    return this.#lock.run(async () => {
      if (this.#closed) return;
      const next = await readNvmetTree(this.#o.nvmetDir);
      const prev = this.#state;
      this.#state = next;
      // nvmet_port_subsys_drop_link -> nvmet_port_del_ctrls, and nvmet_subsys_del_ctrls.
      for (const c of this.#ctrls) {
        if (c.deleted) continue;
        const port = next.ports.get(c.portId);
        if (!next.subsystems.has(c.subnqn)) this.#deleteCtrl(c, "subsystem removed");
        else if (!port?.subsystems.has(c.subnqn))
          this.#deleteCtrl(c, `subsystem unlinked from port ${c.portId}`);
      }
      await this.#syncNamespaces(next);
      await this.#syncPorts(next);
      await this.#syncDebugfsSubsystems(prev, next);
    });
  }

  /** Stops listening and closes every controller and namespace; the tree is left as it is. */
  async close(): Promise<void> {
    if (this.#timer) clearInterval(this.#timer);
    await this.#lock.run(async () => {
      this.#closed = true;
      for (const c of this.#ctrls) this.#deleteCtrl(c, "target stopped");
      for (const l of this.#listeners.values()) await l.close();
      this.#listeners.clear();
      for (const m of this.#open.values()) for (const ns of m.values()) await ns.file.close();
      this.#open.clear();
    });
  }

  // --- configfs effects ---

  async #syncNamespaces(next: NvmetState): Promise<void> {
    const changed = new Set<string>();
    for (const [nqn, open] of this.#open) {
      const sub = next.subsystems.get(nqn);
      for (const [nsid, ns] of open) {
        const now = sub?.namespaces.get(nsid);
        if (now?.enabled && now.devicePath === ns.state.devicePath) continue;
        // nvmet_ns_disable: the namespace leaves the subsystem; I/O to it now fails.
        open.delete(nsid);
        await ns.file.close();
        changed.add(nqn);
        this.#log.info("nvmet namespace disabled", { nqn, nsid });
      }
      if (open.size === 0) this.#open.delete(nqn);
    }
    for (const sub of next.subsystems.values()) {
      for (const ns of sub.namespaces.values()) {
        if (!ns.enabled || !ns.devicePath || this.#open.get(sub.nqn)?.has(ns.nsid)) continue;
        try {
          const opened = await this.#openDevice(ns);
          let m = this.#open.get(sub.nqn);
          if (!m) {
            m = new Map();
            this.#open.set(sub.nqn, m);
          }
          m.set(ns.nsid, opened);
          changed.add(sub.nqn);
        } catch (err) {
          // The kernel would have refused enable=1; the sim configfs checked the path exists.
          this.#log.warn("nvmet cannot open namespace device", {
            nqn: sub.nqn,
            nsid: ns.nsid,
            path: ns.devicePath,
            error: String(err),
          });
        }
      }
    }
    for (const nqn of changed) this.#announce(nqn);
  }

  async #openDevice(ns: NamespaceState): Promise<OpenNs> {
    const path = this.#o.resolveDevice ? this.#o.resolveDevice(ns.devicePath) : ns.devicePath;
    const file = await open(path, "r+");
    try {
      const st = await stat(path);
      let size = st.size;
      if (st.isBlockDevice()) {
        // The size of a block device is in sysfs (512-byte sectors), not in its inode.
        const name = basename(await realpath(path));
        size = Number((await readFile(`/sys/class/block/${name}/size`, "utf8")).trim()) * BLOCK;
      }
      return { state: ns, file, sizeBytes: size - (size % BLOCK) };
    } catch (err) {
      await file.close();
      throw err;
    }
  }

  async #syncPorts(next: NvmetState): Promise<void> {
    for (const [id, l] of this.#listeners) {
      const p = next.ports.get(id);
      const want = p && p.subsystems.size > 0 ? FABRIC_TRTYPE[p.trtype] : undefined;
      if (p && want === l.addr.trtype && p.traddr === l.addr.traddr && p.trsvcid === l.addr.trsvcid) continue;
      // nvmet_disable_port: the transport stops listening.
      this.#listeners.delete(id);
      await l.close();
      this.#log.info("nvmet port disabled", { port: id });
    }
    for (const p of next.ports.values()) {
      const trtype = FABRIC_TRTYPE[p.trtype];
      if (p.subsystems.size === 0 || !trtype || this.#listeners.has(p.id)) continue;
      try {
        const l = await this.#o.fabric.listen({ trtype, traddr: p.traddr, trsvcid: p.trsvcid }, (conn) =>
          this.#accept(p.id, conn),
        );
        this.#listeners.set(p.id, l);
        this.#log.info("nvmet port enabled", { port: p.id, traddr: p.traddr, trsvcid: p.trsvcid });
      } catch (err) {
        // The kernel would have refused the first link (add_port failed); retried on the next scan.
        this.#log.warn("nvmet port cannot listen", { port: p.id, error: String(err) });
      }
    }
  }

  async #syncDebugfsSubsystems(prev: NvmetState, next: NvmetState): Promise<void> {
    const dir = this.#o.debugfsDir;
    if (!dir) return;
    await mkdir(dir, { recursive: true });
    for (const nqn of next.subsystems.keys()) {
      if (!prev.subsystems.has(nqn)) await mkdir(join(dir, nqn), { recursive: true });
    }
    for (const nqn of prev.subsystems.keys()) {
      if (!next.subsystems.has(nqn)) await rm(join(dir, nqn), { recursive: true, force: true });
    }
  }

  // --- controllers ---

  #deleteCtrl(c: Ctrl, why: string): void {
    if (c.deleted) return;
    c.deleted = true;
    this.#log.info("nvmet controller deleted", { nqn: c.subnqn, cntlid: c.cntlid, host: c.hostnqn, why });
    // The transport's delete_ctrl shuts the queues' sockets down; the host sees the connection go.
    c.conn.close();
    for (const q of c.ioConns) q.close();
  }

  #namespaceInfo(nqn: string): NamespaceInfo[] {
    return [...(this.#open.get(nqn)?.values() ?? [])]
      .sort((a, b) => a.state.nsid - b.state.nsid)
      .map((ns) => ({
        nsid: ns.state.nsid,
        uuid: ns.state.uuid,
        nguid: ns.state.nguid,
        blockSize: BLOCK,
        numBlocks: ns.sizeBytes / BLOCK,
      }));
  }

  #announce(nqn: string): void {
    const namespaces = this.#namespaceInfo(nqn);
    for (const c of this.#ctrls)
      if (!c.deleted && c.subnqn === nqn) c.conn.send({ op: "namespaces", namespaces });
  }

  #accept(portId: string, conn: FabricServerConnection): void {
    let ctrl: Ctrl | undefined;
    let ioQueue = false;
    let connecting = false;
    const auth: AuthSlot = {};
    conn.onFrame((msg, payload) => {
      if (msg.op === "auth_send" || msg.op === "auth_receive") {
        return serveAuthFrame(auth.session, conn, msg, payload, this.#log);
      }
      if (msg.op === "connect") {
        if (ctrl || connecting) return;
        connecting = true;
        void this.#connect(portId, conn, msg, auth).then((joined) => {
          connecting = false;
          if (!joined) return;
          ctrl = joined.ctrl;
          ioQueue = joined.io;
        });
        return;
      }
      if (!ctrl || ctrl.deleted) return conn.close();
      ctrl.lastTraffic = Date.now();
      if (msg.op === "keep_alive") return conn.send({ op: "ok", tag: msg.tag });
      if (ioQueue && isBlockCommand(msg)) return void this.#io(ctrl, conn, msg, payload);
      // Block commands on the admin queue, or any other command: Invalid Command Opcode, so a
      // host never waits for a reply.
      if ("tag" in msg) conn.send({ op: "error", tag: msg.tag, errno: EOPNOTSUPP });
    });
    conn.onClose(() => {
      if (!ctrl) return;
      if (ioQueue) {
        ctrl.ioConns.delete(conn);
        return;
      }
      // The admin queue gone ends the controller and its I/O queues.
      ctrl.deleted = true;
      for (const q of ctrl.ioConns) q.close();
      this.#ctrls.delete(ctrl);
      void this.#removeDebugfsCtrl(ctrl);
    });
  }

  /**
   * nvmet_setup_auth: a linked host whose entry has a key authenticates every queue before it is
   * usable (the host then connects again on the same connection). True when the challenge went out.
   */
  #requireAuth(
    conn: FabricServerConnection,
    msg: ConnectMessage,
    sub: SubsystemState,
    auth: AuthSlot,
  ): boolean {
    const host = this.#state.hosts.get(msg.hostnqn);
    if (!host?.dhchapKey || !sub.allowedHosts.has(host.nqn)) return false;
    const s = auth.session;
    if (s?.authenticated && s.hostnqn === msg.hostnqn && s.subnqn === sub.nqn) return false;
    auth.session = new TargetAuthSession(
      msg.hostnqn,
      sub.nqn,
      { hostSecret: host.dhchapKey, ctrlSecret: host.dhchapCtrlKey || undefined },
      hostAuthPolicy(host),
    );
    conn.send({ op: "auth_required", tag: msg.tag });
    return true;
  }

  /** nvmet_keep_alive_timer: a controller with no traffic for a whole kato is torn down. */
  #watchKeepAlive(c: Ctrl): void {
    if (c.kato <= 0) return;
    const timer = setInterval(
      () => {
        if (c.deleted) return clearInterval(timer);
        if (Date.now() - c.lastTraffic > c.kato) {
          clearInterval(timer);
          this.#deleteCtrl(c, "keep-alive timer expired");
        }
      },
      Math.max(10, Math.floor(c.kato / 4)),
    );
    timer.unref?.();
  }

  /** nvmet_execute_admin_connect + nvmet_alloc_ctrl; undefined (and the reply sent) when refused. */
  async #connect(
    portId: string,
    conn: FabricServerConnection,
    msg: ConnectMessage,
    auth: AuthSlot,
  ): Promise<{ ctrl: Ctrl; io: boolean } | undefined> {
    const reject = (reason: string) => {
      this.#log.info("nvmet connect refused", { nqn: msg.subnqn, host: msg.hostnqn, reason });
      conn.send({ op: "rejected", tag: msg.tag, reason });
      return undefined;
    };
    const state = this.#state;
    const port = state.ports.get(portId);
    const sub: SubsystemState | undefined = port?.subsystems.has(msg.subnqn)
      ? state.subsystems.get(msg.subnqn)
      : undefined;
    if (!sub) return reject(`connect request for invalid subsystem ${msg.subnqn}`);
    if (!hostAllowed(sub, msg.hostnqn)) {
      return reject(`connect by host ${msg.hostnqn} for subsystem ${msg.subnqn} not allowed`);
    }
    if ((msg.qid ?? 0) > 0) {
      // nvmet_ctrl_find_get: an I/O queue joins the live controller of that subsystem with its
      // cntlid and host NQN; the host ACL was checked when the admin queue connected.
      const owner = [...this.#ctrls].find(
        (c) => !c.deleted && c.subnqn === sub.nqn && c.cntlid === msg.cntlid && c.hostnqn === msg.hostnqn,
      );
      if (!owner) return reject(`could not find controller ${msg.cntlid} for subsystem ${sub.nqn}`);
      if (this.#requireAuth(conn, msg, sub, auth)) return undefined;
      owner.ioConns.add(conn);
      conn.send({
        op: "connected",
        tag: msg.tag,
        ctrlr: ctrlrInfo(sub, owner.cntlid),
        namespaces: this.#namespaceInfo(sub.nqn),
      });
      return { ctrl: owner, io: true };
    }
    if (this.#requireAuth(conn, msg, sub, auth)) return undefined;
    const cntlid = this.#allocateCntlid(sub);
    if (cntlid === undefined) return reject("no controller ID left");
    const ctrl: Ctrl = {
      subnqn: sub.nqn,
      cntlid,
      hostnqn: msg.hostnqn,
      portId,
      hostTraddr: msg.peerAddress,
      conn,
      ioConns: new Set(),
      kato: msg.kato ?? 0,
      lastTraffic: Date.now(),
      deleted: false,
    };
    this.#ctrls.add(ctrl);
    await this.#writeDebugfsCtrl(ctrl);
    conn.send({
      op: "connected",
      tag: msg.tag,
      ctrlr: ctrlrInfo(sub, cntlid),
      namespaces: this.#namespaceInfo(sub.nqn),
    });
    this.#watchKeepAlive(ctrl);
    return { ctrl, io: false };
  }

  #allocateCntlid(sub: SubsystemState): number | undefined {
    const used = new Set([...this.#ctrls].filter((c) => c.subnqn === sub.nqn).map((c) => c.cntlid));
    for (let id = sub.cntlidMin; id <= sub.cntlidMax; id++) if (!used.has(id)) return id;
    return undefined;
  }

  /**
   * One block command on an I/O queue, against the namespace's backing file (the file-backed
   * nvmet_file_execute_* handlers): read, write, flush (fsync), write zeroes; deallocate is
   * advisory and completes without changing data, as a device without DLFEAT may.
   */
  async #io(ctrl: Ctrl, conn: FabricServerConnection, msg: BlockCommand, payload: Buffer): Promise<void> {
    const fail = (errno: number) => conn.send({ op: "error", tag: msg.tag, errno });
    if (ctrl.deleted) return;
    const ns = this.#open.get(ctrl.subnqn)?.get(msg.nsid);
    // nvmet_req_find_ns: no enabled namespace with that NSID is Invalid Namespace.
    if (!ns) return fail(5);
    if (msg.op === "flush") {
      try {
        await ns.file.sync();
        return conn.send({ op: "ok", tag: msg.tag });
      } catch {
        return fail(5);
      }
    }
    const length = msg.op === "write" ? payload.length : msg.length;
    if (msg.offset < 0 || msg.offset + length > ns.sizeBytes) return fail(22);
    try {
      if (msg.op === "read") {
        const buf = Buffer.alloc(length);
        let done = 0;
        while (done < length) {
          const r = await ns.file.read(buf, done, length - done, msg.offset + done);
          if (r.bytesRead === 0) break;
          done += r.bytesRead;
        }
        conn.send({ op: "data", tag: msg.tag }, buf);
        return;
      }
      if (msg.op === "write") {
        let done = 0;
        while (done < length) {
          const w = await ns.file.write(payload, done, length - done, msg.offset + done);
          done += w.bytesWritten;
        }
      } else if (msg.op === "write_zeroes") {
        // One zeroed MiB written over and over: a Write Zeroes may cover the whole namespace.
        let done = 0;
        while (done < length) {
          const n = Math.min(ZEROS.length, length - done);
          const w = await ns.file.write(ZEROS, 0, n, msg.offset + done);
          done += w.bytesWritten;
        }
      }
      conn.send({ op: "ok", tag: msg.tag });
    } catch {
      fail(5);
    }
  }

  // --- debugfs ---

  async #writeDebugfsCtrl(c: Ctrl): Promise<void> {
    const dir = this.#o.debugfsDir;
    if (!dir) return;
    const d = join(dir, c.subnqn, `ctrl${c.cntlid}`);
    await mkdir(d, { recursive: true });
    await writeFile(join(d, "port"), `${c.portId}\n`);
    // debugfs.c prints the host NQN with seq_puts: no newline.
    await writeFile(join(d, "hostnqn"), c.hostnqn);
    // debugfs prints kato in seconds.
    await writeFile(join(d, "kato"), `${Math.round(c.kato / 1000)}\n`);
    await writeFile(join(d, "state"), "ready\n");
    await writeFile(join(d, "host_traddr"), `${c.hostTraddr}\n`);
  }

  async #removeDebugfsCtrl(c: Ctrl): Promise<void> {
    const dir = this.#o.debugfsDir;
    if (!dir) return;
    await rm(join(dir, c.subnqn, `ctrl${c.cntlid}`), { recursive: true, force: true });
  }
}

type BlockCommand = Extract<Message, { op: "read" | "write" | "flush" | "discard" | "write_zeroes" }>;

function isBlockCommand(msg: Message): msg is BlockCommand {
  return (
    msg.op === "read" ||
    msg.op === "write" ||
    msg.op === "flush" ||
    msg.op === "discard" ||
    msg.op === "write_zeroes"
  );
}

/** Identify Controller as nvmet reports it (reduced). */
function ctrlrInfo(sub: SubsystemState, cntlid: number) {
  return {
    cntlid,
    vendorId: "0x1af4",
    modelNumber: sub.model,
    serialNumber: sub.serial,
    firmwareRevision: sub.firmware,
    subnqn: sub.nqn,
    nvmeVersion: "2.1",
  };
}

export type { HostState, NvmetState, SubsystemState };
