// The NVMe-oF target of one emulated app: transports, subsystems with namespaces, listeners and
// host ACLs, and the controllers initiators connect through the SimFabric. Runtime state only:
// a crash loses all of it, exactly like nvmf_tgt loses its configuration on restart.
import type { Logger } from "../../../lib/log.ts";
import type { Bdev, BdevRegistry } from "./bdev.ts";
import { zeroRange } from "./block-io.ts";
import { TICK_RATE } from "./core-mask.ts";
import type { FabricListener, FabricServerConnection, SimFabric } from "./fabric.ts";
import { authGate, serveAuthFrame, type TargetAuthSession, type TargetKeys } from "./fabric-auth.ts";
import type { AnaState, Message, NamespaceInfo } from "./fabric-protocol.ts";
import { tlsAccept } from "./fabric-tls.ts";
import type { IoStat } from "./io-stat.ts";
import type { JsonValue } from "./json-stream.ts";
import { DISCOVERY_NQN } from "./nqn.ts";
import { initiatorErrnoOf } from "./nvme-completion.ts";
import { Errno, ErrnoError, PATH_ERRNO } from "./rpc-error.ts";

/** Transports nvmf_tgt can be built with. */
export type Trtype = "TCP" | "RDMA";
/** Address families as SPDK prints them. */
export type Adrfam = "IPv4" | "IPv6" | "IB" | "FC" | "INTRA_HOST";

/** A listen address (trid) as SPDK prints it. */
export interface ListenAddress {
  readonly trtype: Trtype;
  readonly adrfam: Adrfam;
  readonly traddr: string;
  readonly trsvcid: string;
}

/** Transport options, in nvmf_get_transports' print order per transport. */
export type TransportOpts = { [key: string]: JsonValue };

/** A namespace of a subsystem; its bdev is claimed exclusive_write while it is exported. */
export interface Namespace {
  readonly nsid: number;
  readonly bdev: Bdev;
  readonly uuid: string;
  /** 32 uppercase hex digits. */
  readonly nguid: string;
  readonly eui64: string | undefined;
  /** The namespace's ANA group: anagrpid given at add_ns, else its NSID (SPDK's default). */
  readonly anagrpid: number;
}

/** An allowed host, with the DH-HMAC-CHAP key names it must authenticate with (fabric-auth.ts). */
export interface Host {
  readonly nqn: string;
  readonly dhchapKey?: string;
  readonly dhchapCtrlrKey?: string;
  /** Keyring name of the host's TLS PSK (kept by the TCP transport; not listed on the entry). */
  readonly psk?: string;
}

/** A connected controller of a subsystem (one fabric connection). */
export interface TargetController {
  readonly cntlid: number;
  readonly hostnqn: string;
  readonly hostid: string;
  readonly listen: ListenAddress;
  readonly peer: { traddr: string; trsvcid: string };
  /** The admin queue's connection; the controller lives as long as it does. */
  readonly conn: FabricServerConnection;
  /** The I/O queues' connections, admitted by cntlid while the controller exists. */
  readonly ioConns: Set<FabricServerConnection>;
  /** Keep Alive Timeout in ms (0: none) and when the last Keep Alive arrived. */
  readonly kato: number;
  lastKeepAlive: number;
  readonly pollGroup: number;
  /** I/O commands in flight; an I/O qpair exists while this is positive. */
  inflight: number;
  /** An I/O qpair was ever connected (reported as num_io_qpairs). */
  ioQpairs: number;
}

/** A subsystem; `discovery` is the well-known one every target has. */
export class Subsystem {
  readonly hosts: Host[] = [];
  readonly listeners: ListenAddress[] = [];
  /** listenerKey()s of the listeners added with secure_channel (TLS only; not listed by SPDK). */
  readonly secure = new Set<string>();
  readonly namespaces = new Map<number, Namespace>();
  readonly controllers: TargetController[] = [];
  allowAnyHost: boolean;
  /** Created with ana_reporting: each listener then has an ANA state per group 1..max_namespaces. */
  anaReporting = false;
  /** ANA states per listener (listenerKey), index g-1 for group g; filled on first use. */
  readonly #ana = new Map<string, AnaState[]>();
  #nextCntlid: number;

  constructor(
    readonly nqn: string,
    readonly subtype: "NVMe" | "Discovery",
    readonly serialNumber: string,
    readonly modelNumber: string,
    readonly maxNamespaces: number,
    readonly minCntlid: number,
    readonly maxCntlid: number,
    allowAnyHost: boolean,
  ) {
    this.allowAnyHost = allowAnyHost;
    this.#nextCntlid = minCntlid;
  }

  /** The next controller ID in [min_cntlid, max_cntlid], wrapping around, skipping live ones. */
  allocateCntlid(): number | undefined {
    const span = this.maxCntlid - this.minCntlid + 1;
    for (let k = 0; k < span; k++) {
      const id = this.#nextCntlid;
      this.#nextCntlid = id >= this.maxCntlid ? this.minCntlid : id + 1;
      if (!this.controllers.some((c) => c.cntlid === id)) return id;
    }
    return undefined;
  }

  hostAllowed(hostnqn: string): boolean {
    return this.allowAnyHost || this.hosts.some((h) => h.nqn === hostnqn);
  }

  findListener(a: ListenAddress): ListenAddress | undefined {
    return this.listeners.find((l) => sameAddress(l, a));
  }

  /** The ANA states of listener `a`, one per group (all optimized at first); undefined without ana_reporting. */
  anaStates(a: ListenAddress): AnaState[] | undefined {
    if (!this.anaReporting) return undefined;
    const key = listenerKey(a);
    let states = this.#ana.get(key);
    if (!states) {
      states = Array.from({ length: Math.max(1, this.maxNamespaces) }, () => "optimized" as AnaState);
      this.#ana.set(key, states);
    }
    return states;
  }

  /**
   * The ANA state a controller on listener `a` sees for its namespaces: that of the group of the
   * lowest namespace (each namespace's ANA group is its NSID, SPDK's default anagrpid).
   */
  anaStateOf(a: ListenAddress): AnaState | undefined {
    const states = this.anaStates(a);
    if (!states) return undefined;
    const first = this.sortedNamespaces()[0]?.nsid ?? 1;
    return states[first - 1] ?? states[0];
  }

  /** Namespaces in NSID order. */
  sortedNamespaces(): Namespace[] {
    return [...this.namespaces.values()].sort((a, b) => a.nsid - b.nsid);
  }
}

/** Equal trids for listener purposes: transport, family, address and service. */
export function sameAddress(a: ListenAddress, b: ListenAddress): boolean {
  return a.trtype === b.trtype && a.adrfam === b.adrfam && a.traddr === b.traddr && a.trsvcid === b.trsvcid;
}

/** Per poll group counters, as nvmf_get_stats reports them. */
export interface PollGroupStats {
  adminQpairs: number;
  ioQpairs: number;
  currentAdminQpairs: number;
  currentIoQpairs: number;
  completedNvmeIo: number;
}

interface BoundListener {
  readonly addr: ListenAddress;
  readonly fabric: FabricListener | undefined;
  readonly users: Set<Subsystem>;
}

/** A target library call failed (SPDK's spdk_nvmf_* returned an error); the RPC layer picks the reply. */
export class TargetError extends Error {}

/** SPDK_NVMF_DEFAULT_MAX_SUBSYSTEMS. */
export const DEFAULT_MAX_SUBSYSTEMS = 1024;

/**
 * The target. Synchronous methods validate and mutate atomically; the asynchronous ones (listener
 * changes, subsystem deletion) bind or close sockets and must be serialised by the caller. Errors
 * are TargetError, or ErrnoError EPERM when a bdev is already claimed.
 */
export class NvmfTarget {
  readonly transports = new Map<Trtype, TransportOpts>();
  readonly #subsystems = new Map<string, Subsystem>();
  readonly #bound = new Map<string, BoundListener>();
  readonly #pollGroups: PollGroupStats[];
  #nextPollGroup = 0;
  /**
   * nvmf_set_max_subsystems (STARTUP only); 0 means SPDK's default, 1024. The discovery
   * subsystem takes one of the IDs, as in spdk_nvmf_tgt_create.
   */
  maxSubsystems = 0;

  constructor(
    private readonly registry: BdevRegistry,
    private readonly fabric: SimFabric | undefined,
    pollGroups: number,
    private readonly log: Logger,
    /** The DH-HMAC-CHAP secrets behind a host entry's key names; without it keyed hosts are refused. */
    private readonly hostKeys?: (host: Host) => TargetKeys,
    /** The configured TLS PSK (interchange text) behind a host entry's psk, read at handshake time. */
    private readonly hostPsk?: (host: Host) => string | undefined,
  ) {
    this.#pollGroups = Array.from({ length: pollGroups }, () => ({
      adminQpairs: 0,
      ioQpairs: 0,
      currentAdminQpairs: 0,
      currentIoQpairs: 0,
      completedNvmeIo: 0,
    }));
    this.#subsystems.set(
      DISCOVERY_NQN,
      new Subsystem(DISCOVERY_NQN, "Discovery", "", "", 0, 1, 0xffef, true),
    );
    registry.addRemovalHook((b) => this.#onBdevRemoved(b));
    registry.addResizeHook(async (b) => {
      for (const s of this.#subsystems.values()) {
        if ([...s.namespaces.values()].some((n) => n.bdev === b)) this.#announceNamespaces(s);
      }
    });
  }

  /** Subsystems in NQN order (SPDK keeps them in a tree keyed by NQN); discovery included. */
  subsystems(): Subsystem[] {
    return [...this.#subsystems.values()].sort((a, b) => (a.nqn < b.nqn ? -1 : a.nqn > b.nqn ? 1 : 0));
  }

  subsystem(nqn: string): Subsystem | undefined {
    return this.#subsystems.get(nqn);
  }

  /** Subsystems this target can hold, the discovery subsystem included. */
  get subsystemLimit(): number {
    return this.maxSubsystems || DEFAULT_MAX_SUBSYSTEMS;
  }

  /** Every subsystem ID is taken (spdk_nvmf_subsystem_create: "No available subsystem IDs"). */
  get full(): boolean {
    return this.#subsystems.size >= this.subsystemLimit;
  }

  /** Adds a subsystem; TargetError when the NQN is taken or no subsystem ID is left. */
  addSubsystem(s: Subsystem): void {
    if (this.#subsystems.has(s.nqn)) throw new TargetError(`subsystem ${s.nqn} exists`);
    if (this.full) throw new TargetError("no available subsystem IDs");
    this.#subsystems.set(s.nqn, s);
  }

  /** Stops and removes a subsystem: controllers disconnected, listeners and namespaces dropped. */
  async deleteSubsystem(s: Subsystem): Promise<void> {
    for (const c of [...s.controllers]) dropController(c);
    for (const l of [...s.listeners]) await this.removeListener(s, l);
    for (const ns of [...s.namespaces.values()]) this.#dropNamespace(s, ns);
    this.#subsystems.delete(s.nqn);
  }

  /**
   * Adds a namespace (NSID 0 or absent: the lowest free one) and announces it to connected hosts.
   * TargetError for a missing bdev or a taken or out-of-range NSID, ErrnoError EPERM for a bdev
   * claimed elsewhere (an lvstore base, another namespace).
   */
  addNamespace(
    s: Subsystem,
    bdevName: string,
    opts: { nsid?: number; uuid?: string; nguid?: string; eui64?: string; anagrpid?: number },
  ): number {
    const bdev = this.registry.get(bdevName);
    if (!bdev) throw new TargetError(`bdev ${bdevName} not found`);
    let nsid = opts.nsid ?? 0;
    const max = s.maxNamespaces === 0 ? 0xfffffffe : s.maxNamespaces;
    if (nsid === 0) {
      nsid = 1;
      while (s.namespaces.has(nsid)) nsid++;
      if (nsid > max) throw new TargetError("no free NSID");
    } else if (nsid > max || s.namespaces.has(nsid)) {
      throw new TargetError(`NSID ${nsid} unavailable`);
    }
    // nvmf opens the bdev with an exclusive-write claim: a bdev serves one namespace at a time.
    this.registry.claim(bdev, "exclusive_write", `nvmf:${s.nqn}:${nsid}`);
    const uuid = opts.uuid ?? bdev.uuid;
    const nguid = opts.nguid ?? uuid.replaceAll("-", "").toUpperCase();
    s.namespaces.set(nsid, { nsid, bdev, uuid, nguid, eui64: opts.eui64, anagrpid: opts.anagrpid || nsid });
    this.#announceNamespaces(s);
    return nsid;
  }

  /** Removes namespace `nsid`; TargetError when absent. */
  removeNamespace(s: Subsystem, nsid: number): void {
    const ns = s.namespaces.get(nsid);
    if (!ns) throw new TargetError(`NSID ${nsid} not found`);
    this.#dropNamespace(s, ns);
  }

  #dropNamespace(s: Subsystem, ns: Namespace): void {
    s.namespaces.delete(ns.nsid);
    this.registry.release(ns.bdev, `nvmf:${s.nqn}:${ns.nsid}`);
    this.#announceNamespaces(s);
  }

  /** A bdev going away takes its namespaces with it (hot remove). */
  async #onBdevRemoved(bdev: Bdev): Promise<void> {
    for (const s of this.#subsystems.values()) {
      for (const ns of [...s.namespaces.values()]) {
        if (ns.bdev === bdev) {
          this.log.info("namespace hot-removed with its bdev", {
            nqn: s.nqn,
            nsid: ns.nsid,
            bdev: bdev.name,
          });
          this.#dropNamespace(s, ns);
        }
      }
    }
  }

  /**
   * Starts listening for `s` on `addr` (sharing the socket with other subsystems on the same
   * address). TargetError when the listener exists or the address cannot be bound.
   */
  async addListener(s: Subsystem, addr: ListenAddress, secureChannel = false): Promise<void> {
    if (s.findListener(addr)) throw new TargetError("Listener already exists");
    const key = listenerKey(addr);
    let bound = this.#bound.get(key);
    if (!bound) {
      let fabricListener: FabricListener | undefined;
      if (this.fabric) {
        try {
          fabricListener = await this.fabric.listen(
            { trtype: addr.trtype, traddr: addr.traddr, trsvcid: addr.trsvcid },
            (conn) => this.#accept(addr, conn),
          );
        } catch (err) {
          throw new TargetError(`listen on ${addr.traddr}:${addr.trsvcid} failed: ${String(err)}`);
        }
      }
      if (s.findListener(addr)) {
        await fabricListener?.close();
        throw new TargetError("Listener already exists");
      }
      bound = this.#bound.get(key) ?? { addr, fabric: fabricListener, users: new Set() };
      this.#bound.set(key, bound);
    }
    bound.users.add(s);
    if (secureChannel) s.secure.add(key);
    // SPDK lists listeners newest first.
    s.listeners.unshift(addr);
  }

  /** Stops `s` listening on `addr`: its controllers on that address are disconnected. */
  async removeListener(s: Subsystem, addr: ListenAddress): Promise<void> {
    const mine = s.findListener(addr);
    if (!mine) throw new TargetError("Listener not found");
    s.listeners.splice(s.listeners.indexOf(mine), 1);
    for (const c of [...s.controllers]) if (sameAddress(c.listen, addr)) dropController(c);
    const key = listenerKey(addr);
    s.secure.delete(key);
    const bound = this.#bound.get(key);
    if (bound) {
      bound.users.delete(s);
      if (bound.users.size === 0) {
        this.#bound.delete(key);
        await bound.fabric?.close();
      }
    }
  }

  /** Adds an allowed host (newest first, as SPDK lists them); TargetError when present. */
  addHost(s: Subsystem, host: Host): void {
    if (s.hosts.some((h) => h.nqn === host.nqn)) throw new TargetError(`host ${host.nqn} present`);
    s.hosts.unshift(host);
  }

  /**
   * Replaces the key names of allowed host `nqn` in place (spdk_nvmf_subsystem_set_keys): later
   * authentications use them, connected controllers are left as they are. Returns the entry it
   * replaced; TargetError when the host is absent.
   */
  setHostKeys(s: Subsystem, host: Host): Host {
    const at = s.hosts.findIndex((h) => h.nqn === host.nqn);
    if (at < 0) throw new TargetError(`host ${host.nqn} absent`);
    const old = s.hosts[at] as Host;
    s.hosts[at] = host;
    return old;
  }

  /**
   * Removes a host and disconnects its controllers at once, admin and I/O queues, as SPDK's
   * spdk_nvmf_subsystem_disconnect_host does; a reconnect is then refused at CONNECT. TargetError
   * when absent.
   */
  removeHost(s: Subsystem, nqn: string): void {
    const at = s.hosts.findIndex((h) => h.nqn === nqn);
    if (at < 0) throw new TargetError(`host ${nqn} absent`);
    s.hosts.splice(at, 1);
    for (const c of [...s.controllers]) if (c.hostnqn === nqn) dropController(c);
  }

  /**
   * Sets the ANA state of listener `addr` for group `anagrpid` (0 or absent: every group) and
   * sends the ANA change to the controllers connected through it. TargetError for a subsystem
   * without ana_reporting, an unknown listener or a group beyond max_namespaces.
   */
  setAnaState(s: Subsystem, addr: ListenAddress, state: AnaState, anagrpid?: number): void {
    const states = s.anaStates(addr);
    if (!states || !s.findListener(addr)) throw new TargetError("error setting ANA state: -22");
    if (anagrpid !== undefined && anagrpid > states.length)
      throw new TargetError("error setting ANA state: -22");
    if (anagrpid === undefined || anagrpid === 0) states.fill(state);
    else states[anagrpid - 1] = state;
    const now = s.anaStateOf(addr);
    if (now === undefined) return;
    for (const c of s.controllers) if (sameAddress(c.listen, addr)) c.conn.send({ op: "ana", anaState: now });
  }

  /** Counters per poll group (one per reactor core), as nvmf_get_stats reports them. */
  pollGroupStats(): readonly PollGroupStats[] {
    return this.#pollGroups;
  }

  /** Drops everything without a goodbye: connections cut, sockets left as a dead process leaves them. */
  async crash(): Promise<void> {
    for (const s of this.#subsystems.values()) for (const c of [...s.controllers]) dropController(c);
    for (const b of this.#bound.values()) await b.fabric?.close({ crash: true });
    this.#bound.clear();
  }

  /** Graceful stop: connections closed and listener sockets removed. */
  async shutdown(): Promise<void> {
    for (const s of this.#subsystems.values()) for (const c of [...s.controllers]) dropController(c);
    for (const b of this.#bound.values()) await b.fabric?.close();
    this.#bound.clear();
  }

  #announceNamespaces(s: Subsystem): void {
    const namespaces = this.#namespaceInfo(s);
    for (const c of s.controllers) c.conn.send({ op: "namespaces", namespaces });
  }

  #namespaceInfo(s: Subsystem): NamespaceInfo[] {
    return s.sortedNamespaces().map((ns) => ({
      nsid: ns.nsid,
      uuid: ns.uuid,
      nguid: ns.nguid,
      blockSize: ns.bdev.blockSize,
      numBlocks: ns.bdev.numBlocks,
    }));
  }

  /**
   * A new fabric connection on `addr`: wait for CONNECT and apply the ACL. An admin queue (qid 0)
   * creates a controller and then carries Keep Alive; an I/O queue names its controller's cntlid
   * and is admitted only while that controller exists for the same host and the host is still
   * allowed, then carries the block commands, each checked against the same admission.
   */
  #accept(addr: ListenAddress, conn: FabricServerConnection): void {
    let ctrl: TargetController | undefined;
    let sub: Subsystem | undefined;
    let auth: TargetAuthSession | undefined;
    let ioQueue = false;
    // A secure_channel listener takes TLS only: the handshake comes before any NVMe frame, and
    // the CONNECT must be for the host and subsystem of the PSK identity proven (fabric-tls.ts).
    const key = listenerKey(addr);
    const secure = [...this.#subsystems.values()].some((x) => x.secure.has(key));
    let tls: { hostNqn: string; subNqn: string } | undefined;
    conn.onFrame((msg, payload) => {
      if (secure && !tls) {
        const r = tlsAccept(msg, (hostNqn, subNqn) => {
          const host = this.#subsystems.get(subNqn)?.hosts.find((h) => h.nqn === hostNqn);
          return host?.psk !== undefined ? this.hostPsk?.(host) : undefined;
        });
        if ("drop" in r) {
          this.log.info("TLS connection dropped", { listener: key, reason: r.drop });
          return conn.close();
        }
        tls = { hostNqn: r.hostNqn, subNqn: r.subNqn };
        return conn.send(r.reply);
      }
      // A ClientHello on a plain listener is not NVMe/TCP: the connection goes.
      if (msg.op === "tls_client_hello") return conn.close();
      if (msg.op === "auth_send" || msg.op === "auth_receive")
        return serveAuthFrame(auth, conn, msg, payload, this.log);
      if (msg.op === "connect") {
        if (ctrl) return;
        const s = this.#subsystems.get(msg.subnqn);
        const reject = (reason: string) => {
          this.log.info("fabric connect rejected", {
            nqn: msg.subnqn,
            host: msg.hostnqn,
            qid: msg.qid ?? 0,
            reason,
          });
          conn.send({ op: "rejected", tag: msg.tag, reason });
        };
        if (tls && (msg.hostnqn !== tls.hostNqn || msg.subnqn !== tls.subNqn))
          return reject("the CONNECT is not for the TLS PSK identity");
        if (s?.subtype !== "NVMe") return reject("subsystem not found");
        if (!s.findListener(addr)) return reject("listener not allowed for this subsystem");
        if (!s.hostAllowed(msg.hostnqn)) return reject(`host ${msg.hostnqn} not allowed`);
        // A host entry with a key must authenticate on this connection before it gets a controller.
        const host = s.hosts.find((h) => h.nqn === msg.hostnqn);
        const challenge = authGate(auth, host, s.nqn, this.hostKeys);
        if (challenge) {
          auth = challenge;
          return conn.send({ op: "auth_required", tag: msg.tag });
        }
        if ((msg.qid ?? 0) > 0) {
          // nvmf_ctrlr_add_io_qpair: the I/O queue joins a live controller of the same host.
          const owner = s.controllers.find(
            (c) => c.cntlid === msg.cntlid && c.hostnqn === msg.hostnqn && c.hostid === msg.hostid,
          );
          if (!owner) return reject(`unknown controller ID ${msg.cntlid}`);
          ctrl = owner;
          sub = s;
          ioQueue = true;
          owner.ioConns.add(conn);
          conn.send({
            op: "connected",
            tag: msg.tag,
            ctrlr: this.#ctrlrInfo(s, owner.cntlid),
            namespaces: this.#namespaceInfo(s),
            ...this.#anaOf(s, addr),
          });
          return;
        }
        const cntlid = s.allocateCntlid();
        if (cntlid === undefined) return reject("no controller ID left");
        const pollGroup = this.#nextPollGroup++ % this.#pollGroups.length;
        ctrl = {
          cntlid,
          hostnqn: msg.hostnqn,
          hostid: msg.hostid,
          listen: addr,
          peer: { traddr: msg.peerAddress, trsvcid: msg.peerPort },
          conn,
          ioConns: new Set(),
          kato: msg.kato ?? 0,
          lastKeepAlive: Date.now(),
          pollGroup,
          inflight: 0,
          ioQpairs: 0,
        };
        sub = s;
        s.controllers.push(ctrl);
        this.#watchKeepAlive(s, ctrl);
        const pg = this.#pollGroups[pollGroup] as PollGroupStats;
        pg.adminQpairs++;
        pg.currentAdminQpairs++;
        conn.send({
          op: "connected",
          tag: msg.tag,
          ctrlr: this.#ctrlrInfo(s, cntlid),
          namespaces: this.#namespaceInfo(s),
          ...this.#anaOf(s, addr),
        });
        return;
      }
      if (!ctrl || !sub) return conn.close();
      if (msg.op === "keep_alive") {
        ctrl.lastKeepAlive = Date.now();
        conn.send({ op: "ok", tag: msg.tag });
        return;
      }
      if (!ioQueue) {
        // Block commands belong on an I/O queue: Invalid Opcode on the admin queue.
        if ("tag" in msg) conn.send({ op: "error", tag: msg.tag, errno: Errno.EINVAL });
        return;
      }
      // Admission on every command: a controller the target dropped, or a host no longer
      // allowed, gets its queue cut rather than an answer.
      if (!sub.controllers.includes(ctrl) || !sub.hostAllowed(ctrl.hostnqn)) return conn.close();
      void this.#io(sub, ctrl, conn, msg, payload);
    });
    conn.onClose(() => {
      if (!ctrl || !sub) return;
      if (ioQueue) {
        ctrl.ioConns.delete(conn);
        return;
      }
      for (const q of ctrl.ioConns) q.close();
      const at = sub.controllers.indexOf(ctrl);
      if (at >= 0) sub.controllers.splice(at, 1);
      const pg = this.#pollGroups[ctrl.pollGroup] as PollGroupStats;
      pg.currentAdminQpairs--;
      if (ctrl.inflight > 0) pg.currentIoQpairs--;
    });
  }

  /**
   * SPDK's keep-alive poller (nvmf_ctrlr_keep_alive_poll, registered with a period of kato): a
   * controller whose last Keep Alive is older than kato when it runs is disconnected, so one goes
   * between kato and twice kato after its last Keep Alive.
   */
  #watchKeepAlive(s: Subsystem, ctrl: TargetController): void {
    if (ctrl.kato <= 0) return;
    const timer = setInterval(
      () => {
        if (!s.controllers.includes(ctrl)) return clearInterval(timer);
        if (Date.now() - ctrl.lastKeepAlive > ctrl.kato) {
          this.log.info("keep-alive timeout, controller disconnected", {
            nqn: s.nqn,
            cntlid: ctrl.cntlid,
            host: ctrl.hostnqn,
          });
          clearInterval(timer);
          dropController(ctrl);
        }
      },
      Math.max(10, ctrl.kato),
    );
    timer.unref?.();
  }

  #ctrlrInfo(s: Subsystem, cntlid: number) {
    return {
      cntlid,
      vendorId: "0x8086",
      modelNumber: s.modelNumber,
      serialNumber: s.serialNumber,
      firmwareRevision: "25.05.1",
      subnqn: s.nqn,
      nvmeVersion: "1.3",
      // nvmf_ctrlr_dsm_supported: Dataset Management only when every namespace can unmap.
      dsm: s.sortedNamespaces().every((ns) => ns.bdev.init.ioTypes.unmap),
    };
  }

  #anaOf(s: Subsystem, addr: ListenAddress): { anaState?: AnaState } {
    const state = s.anaStateOf(addr);
    return state === undefined ? {} : { anaState: state };
  }

  /**
   * One block command from the namespace's bdev. Writes, deallocates and write zeroes to a bdev
   * that cannot write (a snapshot) fail as the bdev layer fails them; Flush and Deallocate on a
   * bdev without them complete successfully, as nvmf_bdev_ctrlr_flush_cmd and _dsm_cmd do.
   */
  async #io(
    s: Subsystem,
    ctrl: TargetController,
    conn: FabricServerConnection,
    msg: Message,
    payload: Buffer,
  ): Promise<void> {
    if (!("nsid" in msg)) return;
    const send = (m: Message, data?: Uint8Array) => conn.send(m, data);
    const pg = this.#pollGroups[ctrl.pollGroup] as PollGroupStats;
    if (ctrl.inflight++ === 0) {
      // An I/O qpair lives while I/O is outstanding, like a bdev channel opened for the I/O.
      pg.ioQpairs++;
      pg.currentIoQpairs++;
      ctrl.ioQpairs = 1;
    }
    let stat: IoStat | undefined;
    try {
      const ns = s.namespaces.get(msg.nsid);
      if (!ns) {
        // Invalid namespace: the command fails; the initiator sees an I/O error.
        return send({ op: "error", tag: msg.tag, errno: Errno.EIO });
      }
      // nvmf_ctrlr_process_io_cmd: a namespace whose ANA group is neither optimized nor
      // non-optimized on this controller's listener fails the command with a path status.
      const ana = s.anaStates(ctrl.listen)?.[ns.anagrpid - 1];
      if (ana !== undefined && ana !== "optimized" && ana !== "non_optimized") {
        return send({ op: "error", tag: msg.tag, errno: PATH_ERRNO });
      }
      const bdev = ns.bdev;
      // Latency runs from submission (before QoS queueing) to completion, as the bdev layer's
      // submit_tsc does; only completed reads, writes and unmaps are counted, as bdev_io_stat_add.
      const submitted = performance.now();
      const ticks = () => ((performance.now() - submitted) / 1000) * TICK_RATE;
      stat = bdev.stat;
      switch (msg.op) {
        case "read": {
          await bdev.qos?.admit("read", msg.length);
          const data = await bdev.io.read(msg.offset, msg.length);
          bdev.stat.complete("read", msg.length, ticks());
          send({ op: "data", tag: msg.tag }, data);
          break;
        }
        case "write":
          await bdev.qos?.admit("write", payload.length);
          await bdev.io.write(msg.offset, payload);
          bdev.stat.complete("write", payload.length, ticks());
          send({ op: "ok", tag: msg.tag });
          break;
        case "flush":
          send({ op: "ok", tag: msg.tag });
          break;
        case "discard":
          if (!bdev.init.ioTypes.write) throw new ErrnoError(Errno.EIO, "read-only bdev");
          if (bdev.init.ioTypes.unmap) {
            await zeroRange(bdev.io, msg.offset, msg.length);
            bdev.stat.complete("unmap", msg.length, ticks());
          }
          send({ op: "ok", tag: msg.tag });
          break;
        case "write_zeroes":
          if (!bdev.init.ioTypes.write) throw new ErrnoError(Errno.EIO, "read-only bdev");
          await zeroRange(bdev.io, msg.offset, msg.length);
          send({ op: "ok", tag: msg.tag });
          break;
        default:
          return;
      }
      pg.completedNvmeIo++;
    } catch (err) {
      stat?.fail();
      send({ op: "error", tag: msg.tag, errno: initiatorErrnoOf(err) });
    } finally {
      if (--ctrl.inflight === 0 && s.controllers.includes(ctrl)) pg.currentIoQpairs--;
    }
  }
}

/** Disconnects a controller: its admin queue (whose close ends the I/O queues) and every I/O queue. */
function dropController(c: TargetController): void {
  for (const q of c.ioConns) q.close();
  c.conn.close();
}

function listenerKey(a: ListenAddress): string {
  return `${a.trtype}|${a.adrfam}|${a.traddr}|${a.trsvcid}`;
}
