// SimFabric: the simulated NVMe-oF network. Either a directory shared by emulator instances (in
// one process or several) where each target listener (trtype, traddr, trsvcid) is a unix socket, or
// real TCP between the nodes' addresses (the real-cluster lab); an initiator connects an admin and
// an I/O queue to a listener, presents host and subsystem NQNs (each queue authenticating with
// DH-HMAC-CHAP when the target asks), and then carries block commands and keep-alives.
import { mkdirSync } from "node:fs";
import { createServer, connect as netConnect, type Server, type Socket } from "node:net";
import { join } from "node:path";
import { AuthError, connectWithAuth, type HostDhchapOptions } from "./fabric-auth.ts";
import {
  type AnaState,
  type ControllerInfo,
  encodeFrameParts,
  FrameDecoder,
  type Message,
  type NamespaceInfo,
} from "./fabric-protocol.ts";
import { tlsConnect } from "./fabric-tls.ts";
import { Errno, ErrnoError } from "./rpc-error.ts";
import { closeServer, listenOn, takeSocketPath } from "./unix-socket.ts";

/** A fabric address: what a listener listens on and an initiator connects to. */
export interface FabricAddress {
  /** Canonical transport: "TCP" or "RDMA". */
  readonly trtype: string;
  readonly traddr: string;
  readonly trsvcid: string;
}

/** How listeners are reached: stateless apart from a unix fabric's directory; cheap to create per user. */
export interface SimFabric {
  /**
   * Starts listening on `addr`. A stale socket (nothing answers) is replaced; a live one means
   * the address is in use (ErrnoError EBUSY), as a second listen() on a port fails. On the TCP
   * fabric an address the machine does not have fails with EADDRNOTAVAIL.
   */
  listen(addr: FabricAddress, onConnection: (conn: FabricServerConnection) => void): Promise<FabricListener>;
  /** Opens one queue's stream to the listener at `addr`; FabricConnectError ENODEV when none answers. */
  dial(addr: FabricAddress): Promise<Socket>;
}

/** The fabric of unix sockets in one directory (bare-process lab and tests). */
export interface UnixSimFabric extends SimFabric {
  readonly dir: string;
  /** The unix socket standing for `addr`. */
  socketPath(addr: FabricAddress): string;
}

/** A bound listener; close() stops accepting and drops its open connections. */
export interface FabricListener {
  readonly addr: FabricAddress;
  /** `crash` leaves the socket file behind, as a killed process does; otherwise it is removed. */
  close(opts?: { crash?: boolean }): Promise<void>;
}

// Linux's sun_path holds 108 bytes including the terminating NUL.
const MAX_SOCKET_PATH = 107;

/** A fabric rooted at `dir` (created if missing). Keep `dir` short: socket paths are limited. */
export function createFabric(dir: string): UnixSimFabric {
  mkdirSync(dir, { recursive: true });
  const socketPath = (addr: FabricAddress) => {
    const safe = (s: string) => s.replace(/[^A-Za-z0-9.:_-]/g, "_");
    const p = join(dir, `${addr.trtype.toLowerCase()}_${safe(addr.traddr)}_${safe(addr.trsvcid)}.sock`);
    if (Buffer.byteLength(p) > MAX_SOCKET_PATH) {
      throw new Error(`fabric socket path too long (${Buffer.byteLength(p)} > ${MAX_SOCKET_PATH}): ${p}`);
    }
    return p;
  };
  return {
    dir,
    socketPath,
    dial: (addr) => dialUnix(socketPath(addr)),
    async listen(addr, onConnection) {
      const path = socketPath(addr);
      await takeSocketPath(path);
      const conns = new Set<Socket>();
      const server: Server = createServer((sock) => {
        conns.add(sock);
        sock.on("close", () => conns.delete(sock));
        onConnection(new FabricServerConnection(sock));
      });
      await listenOn(server, path);
      return {
        addr,
        async close(opts = {}) {
          for (const c of conns) c.destroy();
          await closeServer(server, path, opts.crash === true);
        },
      };
    },
  };
}

/**
 * RDMA listeners of the TCP fabric sit this far above their service id: the lab has no RDMA, and a
 * TCP and an RDMA listener on one address and port are two listeners in NVMe-oF but one TCP port.
 */
export const TCP_FABRIC_RDMA_PORT_OFFSET = 20000;

/** The TCP port standing for `addr` on the TCP fabric. */
export function tcpFabricPort(addr: FabricAddress): number {
  const port = Number(addr.trsvcid);
  if (!Number.isInteger(port) || port < 1 || port > 65535) {
    throw new ErrnoError(Errno.EINVAL, `trsvcid ${JSON.stringify(addr.trsvcid)} is not a TCP port`);
  }
  const p = addr.trtype.toUpperCase() === "RDMA" ? port + TCP_FABRIC_RDMA_PORT_OFFSET : port;
  if (p > 65535) throw new ErrnoError(Errno.EINVAL, `RDMA service id ${port} has no TCP stand-in port`);
  return p;
}

/**
 * The fabric as real TCP: a listener binds traddr:trsvcid on this machine (in the real-cluster
 * lab, the node's address in its network namespace), an initiator connects there, so the fabric
 * crosses the lab's network and a partition, a dead node or an address the node lacks behave as
 * on a real network. The frames are the emulator's (fabric-protocol.ts), not NVMe/TCP PDUs.
 */
export function createTcpFabric(): SimFabric {
  return {
    dial: (addr) => dialTcp(addr.traddr, tcpFabricPort(addr)),
    async listen(addr, onConnection) {
      const port = tcpFabricPort(addr);
      const conns = new Set<Socket>();
      const server: Server = createServer((sock) => {
        sock.setNoDelay(true);
        conns.add(sock);
        sock.on("close", () => conns.delete(sock));
        onConnection(new FabricServerConnection(sock));
      });
      await new Promise<void>((resolve, reject) => {
        server.once("error", (err: NodeJS.ErrnoException) => {
          const errno =
            err.code === "EADDRINUSE"
              ? Errno.EBUSY
              : err.code === "EADDRNOTAVAIL"
                ? Errno.EADDRNOTAVAIL
                : Errno.EIO;
          reject(new ErrnoError(errno, `listen on ${addr.traddr}:${port}: ${err.message}`));
        });
        server.listen({ host: addr.traddr, port, exclusive: true }, () => resolve());
      });
      return {
        addr,
        async close() {
          for (const c of conns) c.destroy();
          await new Promise<void>((resolve) => server.close(() => resolve()));
        },
      };
    },
  };
}

/** The target's end of one fabric connection. */
export class FabricServerConnection {
  readonly #decoder = new FrameDecoder();
  #onFrame: ((msg: Message, payload: Buffer) => void) | undefined;
  #onClose: (() => void) | undefined;
  #closed = false;

  constructor(private readonly sock: Socket) {
    sock.on("data", (chunk: Buffer) => {
      try {
        for (const f of this.#decoder.push(chunk)) this.#onFrame?.(f.msg, f.payload);
      } catch {
        sock.destroy();
      }
    });
    sock.on("close", () => {
      this.#closed = true;
      this.#onClose?.();
    });
    sock.on("error", () => {});
  }

  /** Installs the message handler; frames arriving before are dropped (there are none: the peer waits). */
  onFrame(fn: (msg: Message, payload: Buffer) => void): void {
    this.#onFrame = fn;
  }

  onClose(fn: () => void): void {
    this.#onClose = fn;
    if (this.#closed) fn();
  }

  send(msg: Message, payload?: Uint8Array): void {
    if (!this.#closed) for (const part of encodeFrameParts(msg, payload)) this.sock.write(part);
  }

  close(): void {
    this.sock.destroy();
  }
}

/** Why connecting a controller failed, with the errno SPDK's initiator reports. */
export class FabricConnectError extends ErrnoError {}

/** What an initiator presents when it connects. */
export interface ConnectOptions extends FabricAddress {
  readonly subnqn: string;
  readonly hostnqn: string;
  readonly hostid: string;
  /** Source address reported to the target; defaults to traddr (a loopback-like path). */
  readonly hostaddr?: string;
  /** DH-HMAC-CHAP secrets, used when the target asks the host to authenticate. */
  readonly dhchap?: HostDhchapOptions;
  /**
   * NVMe/TCP TLS with this configured PSK (interchange form): each queue's connection starts with
   * the handshake (fabric-tls.ts) before its CONNECT.
   */
  readonly tls?: { readonly psk: string };
  /**
   * Keep Alive Timeout in ms. The controller sends Keep Alive half of it after the previous one
   * completed and, like the kernel (the command's timeout is kato), treats one left unanswered
   * for a whole kato as a lost link.
   * 0 or absent: no keep-alive (SPDK's bdev_nvme default keeps 10 s; callers choose).
   */
  readonly kato?: number;
  /**
   * How long each queue's CONNECT may wait for the target's answer, in ms (default 10 s): a
   * target that accepts but never answers (a stopped process) fails the connect with ETIMEDOUT
   * instead of hanging it, like the kernel's connect command timeout.
   */
  readonly connectTimeoutMs?: number;
}

/**
 * Connects a controller to the subsystem `opts.subnqn` behind the listener at `opts`: an admin
 * queue (which creates the controller and gets its cntlid), then one I/O queue naming that cntlid,
 * which the target admits only while the controller exists and the host is allowed. Rejects
 * with FabricConnectError ENODEV when nothing listens there and EIO when the target refuses
 * either connect (unknown subsystem, listener not enabled for it, host not allowed), and the errno of
 * fabric-auth.ts's authenticateHost (ENOKEY, ECONNREFUSED) when DH-HMAC-CHAP fails.
 */
export async function connectController(fabric: SimFabric, opts: ConnectOptions): Promise<FabricController> {
  const admin = new FabricQueue(await fabric.dial(opts));
  let io: FabricQueue | undefined;
  try {
    const peerPort = String(32768 + Math.floor(Math.random() * 28000));
    const base = {
      op: "connect" as const,
      tag: 0,
      subnqn: opts.subnqn,
      hostnqn: opts.hostnqn,
      hostid: opts.hostid,
      peerAddress: opts.hostaddr ?? opts.traddr,
      // An ephemeral source port, as the kernel would pick one.
      peerPort,
    };
    const limit = opts.connectTimeoutMs ?? 10_000;
    if (opts.tls) await withTimeout(secured(admin, opts), limit);
    const a = await withTimeout(
      authenticated(admin, { ...base, qid: 0, kato: opts.kato ?? 0 }, opts.dhchap),
      limit,
    );
    const connected = verdict(a.msg);
    io = new FabricQueue(await fabric.dial(opts));
    if (opts.tls) await withTimeout(secured(io, opts), limit);
    const ioConnect = { ...base, qid: 1, cntlid: connected.ctrlr.cntlid };
    verdict((await withTimeout(authenticated(io, ioConnect, opts.dhchap), limit)).msg);
    return new FabricController(admin, io, connected, opts.kato ?? 0);
  } catch (err) {
    admin.close();
    io?.close();
    throw err;
  }
}

/** The TLS handshake on one queue's connection; a failed one is EIO, as SPDK's initiator reports it. */
async function secured(q: FabricQueue, opts: ConnectOptions): Promise<void> {
  try {
    await tlsConnect((m) => q.request(m), (opts.tls as { psk: string }).psk, opts.hostnqn, opts.subnqn);
  } catch (err) {
    throw new FabricConnectError(
      Errno.EIO,
      `TLS handshake with ${opts.traddr}:${opts.trsvcid} failed: ${(err as Error).message}`,
    );
  }
}

/** CONNECT on one queue, with DH-HMAC-CHAP when the target asks (each queue authenticates). */
async function authenticated(
  q: FabricQueue,
  connect: Extract<Message, { op: "connect" }>,
  dhchap: HostDhchapOptions | undefined,
): Promise<{ msg: Message; payload: Buffer }> {
  try {
    return await connectWithAuth((m, p) => q.request(m, p), connect, dhchap);
  } catch (err) {
    if (err instanceof AuthError) throw new FabricConnectError(err.errno, err.detail);
    throw err;
  }
}

function withTimeout<T>(p: Promise<T>, ms: number): Promise<T> {
  return new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new FabricConnectError(Errno.ETIMEDOUT, "connect timed out")), ms);
    p.then(
      (x) => {
        clearTimeout(t);
        resolve(x);
      },
      (e) => {
        clearTimeout(t);
        reject(e);
      },
    );
  });
}

function dialUnix(path: string): Promise<Socket> {
  return new Promise<Socket>((resolve, reject) => {
    const s = netConnect(path);
    s.once("connect", () => resolve(s));
    s.once("error", () => reject(new FabricConnectError(Errno.ENODEV, `nothing listens on ${path}`)));
  });
}

/** A TCP connect bounded like the kernel's: an unreachable address fails instead of hanging. */
function dialTcp(host: string, port: number, timeoutMs = 5000): Promise<Socket> {
  return new Promise<Socket>((resolve, reject) => {
    const s = netConnect({ host, port });
    const t = setTimeout(() => {
      s.destroy();
      reject(new FabricConnectError(Errno.ENODEV, `no answer from ${host}:${port}`));
    }, timeoutMs);
    s.once("connect", () => {
      clearTimeout(t);
      s.setNoDelay(true);
      resolve(s);
    });
    s.once("error", (err) => {
      clearTimeout(t);
      reject(new FabricConnectError(Errno.ENODEV, `nothing listens on ${host}:${port} (${err.message})`));
    });
  });
}

type Connected = Extract<Message, { op: "connected" }>;

function verdict(msg: Message): Connected {
  if (msg.op === "rejected") throw new FabricConnectError(Errno.EIO, msg.reason);
  if (msg.op !== "connected") throw new FabricConnectError(Errno.EIO, `unexpected ${msg.op}`);
  return msg;
}

/** One queue pair's socket: tagged requests and their replies, plus unsolicited notices. */
class FabricQueue {
  readonly #decoder = new FrameDecoder();
  readonly #pending = new Map<
    number,
    { resolve: (f: { msg: Message; payload: Buffer }) => void; reject: (e: Error) => void }
  >();
  #tag = 1;
  closed = false;
  onNotice: (msg: Message) => void = () => {};
  readonly #closeListeners: (() => void)[] = [];

  constructor(private readonly sock: Socket) {
    sock.on("data", (chunk: Buffer) => {
      try {
        for (const f of this.#decoder.push(chunk)) this.#dispatch(f.msg, f.payload);
      } catch {
        sock.destroy();
      }
    });
    sock.on("error", () => {});
    sock.on("close", () => {
      this.closed = true;
      for (const p of this.#pending.values()) p.reject(new ErrnoError(Errno.EIO, "connection lost"));
      this.#pending.clear();
      for (const fn of this.#closeListeners) fn();
    });
  }

  onClose(fn: () => void): void {
    this.#closeListeners.push(fn);
    if (this.closed) fn();
  }

  request(msg: Message, payload?: Uint8Array): Promise<{ msg: Message; payload: Buffer }> {
    if (this.closed) return Promise.reject(new ErrnoError(Errno.EIO, "connection lost"));
    const tag = this.#tag++;
    const framed = { ...msg, tag } as Message;
    return new Promise((resolve, reject) => {
      this.#pending.set(tag, { resolve, reject });
      for (const part of encodeFrameParts(framed, payload)) this.sock.write(part);
    });
  }

  close(): void {
    this.sock.destroy();
  }

  #dispatch(msg: Message, payload: Buffer): void {
    if (msg.op === "namespaces" || msg.op === "ana") {
      this.onNotice(msg);
      return;
    }
    if (!("tag" in msg)) return;
    const p = this.#pending.get(msg.tag);
    if (!p) return;
    this.#pending.delete(msg.tag);
    p.resolve({ msg, payload });
  }
}

/**
 * The initiator's end of a connected controller: identity, namespaces, ANA state and block I/O.
 * Losing either queue (or a keep-alive) closes the whole controller, as the kernel's error
 * recovery tears down every queue before it reconnects.
 */
export class FabricController {
  readonly #admin: FabricQueue;
  readonly #io: FabricQueue;
  readonly #ctrlr: ControllerInfo;
  #namespaces: NamespaceInfo[];
  #anaState: AnaState;
  readonly #anaReporting: boolean;
  #closed = false;
  /** The next Keep Alive to send, or the deadline of the one outstanding. */
  #kaTimer: ReturnType<typeof setTimeout> | undefined;
  readonly #nsListeners: ((ns: readonly NamespaceInfo[]) => void)[] = [];
  readonly #anaListeners: ((s: AnaState) => void)[] = [];
  readonly #closeListeners: (() => void)[] = [];

  /** @internal Built by connectController from two connected queues. */
  constructor(admin: FabricQueue, io: FabricQueue, connected: Connected, kato: number) {
    this.#admin = admin;
    this.#io = io;
    this.#ctrlr = connected.ctrlr;
    this.#namespaces = connected.namespaces;
    this.#anaState = connected.anaState ?? "optimized";
    this.#anaReporting = connected.anaState !== undefined;
    admin.onNotice = (msg) => {
      if (msg.op === "namespaces") {
        this.#namespaces = msg.namespaces;
        for (const fn of this.#nsListeners) fn(msg.namespaces);
      } else if (msg.op === "ana") {
        this.#anaState = msg.anaState;
        for (const fn of this.#anaListeners) fn(msg.anaState);
      }
    };
    const lost = () => {
      if (this.#closed) return;
      this.#closed = true;
      if (this.#kaTimer) clearTimeout(this.#kaTimer);
      admin.close();
      io.close();
      for (const fn of this.#closeListeners) fn();
    };
    admin.onClose(lost);
    io.onClose(lost);
    if (kato > 0) {
      // nvme_keep_alive_work: one Keep Alive at a time, the next kato/2 after the last completed;
      // each has kato to complete (its request timeout), else the link counts as lost.
      const arm = (fn: () => void, ms: number) => {
        this.#kaTimer = setTimeout(fn, ms);
        this.#kaTimer.unref?.();
      };
      const send = () => {
        if (this.#closed) return;
        arm(lost, kato);
        admin.request({ op: "keep_alive", tag: 0 }).then(
          () => {
            if (this.#closed) return;
            clearTimeout(this.#kaTimer);
            arm(send, Math.max(1, Math.floor(kato / 2)));
          },
          () => {},
        );
      };
      arm(send, Math.max(1, Math.floor(kato / 2)));
    }
  }

  /** Identify Controller data. */
  get ctrlr(): ControllerInfo {
    return this.#ctrlr;
  }

  /** Active namespaces, kept current by the target's notices. */
  get namespaces(): readonly NamespaceInfo[] {
    return this.#namespaces;
  }

  /** The ANA state of the path, kept current by the target's notices. */
  get anaState(): AnaState {
    return this.#anaState;
  }

  /** The subsystem reports ANA (Identify Controller CMIC bit 3): created with ana_reporting. */
  get anaReporting(): boolean {
    return this.#anaReporting;
  }

  get closed(): boolean {
    return this.#closed;
  }

  /** Reads `length` bytes of namespace `nsid` at byte `offset`; ErrnoError on failure. */
  async read(nsid: number, offset: number, length: number): Promise<Buffer> {
    const f = await this.#io.request({ op: "read", tag: 0, nsid, offset, length });
    if (f.msg.op === "error") throw new ErrnoError(f.msg.errno);
    return f.payload;
  }

  async write(nsid: number, offset: number, data: Uint8Array): Promise<void> {
    await this.#command({ op: "write", tag: 0, nsid, offset }, data);
  }

  /** NVMe Flush: the target makes earlier completed writes durable. */
  async flush(nsid: number): Promise<void> {
    await this.#command({ op: "flush", tag: 0, nsid });
  }

  /** Dataset Management, Deallocate: the range may then read as zeros. */
  async discard(nsid: number, offset: number, length: number): Promise<void> {
    await this.#command({ op: "discard", tag: 0, nsid, offset, length });
  }

  /** Write Zeroes: the range reads as zeros afterwards. */
  async writeZeroes(nsid: number, offset: number, length: number): Promise<void> {
    await this.#command({ op: "write_zeroes", tag: 0, nsid, offset, length });
  }

  onNamespaces(fn: (ns: readonly NamespaceInfo[]) => void): void {
    this.#nsListeners.push(fn);
  }

  onAnaState(fn: (s: AnaState) => void): void {
    this.#anaListeners.push(fn);
  }

  onClose(fn: () => void): void {
    this.#closeListeners.push(fn);
    if (this.#closed) fn();
  }

  /** Disconnects; idempotent. */
  close(): void {
    this.#admin.close();
    this.#io.close();
  }

  async #command(msg: Message, payload?: Uint8Array): Promise<void> {
    const f = await this.#io.request(msg, payload);
    if (f.msg.op === "error") throw new ErrnoError(f.msg.errno);
  }
}
