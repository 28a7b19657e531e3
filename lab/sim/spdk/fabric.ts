// SimFabric: the simulated NVMe-oF network. A directory shared by emulator instances (in one
// process or several) where each target listener (trtype, traddr, trsvcid) is a unix socket; an
// initiator connects to it, presents host and subsystem NQNs (authenticating with DH-HMAC-CHAP when
// the target asks), and then reads and writes blocks.
import { mkdirSync } from "node:fs";
import { createServer, connect as netConnect, type Server, type Socket } from "node:net";
import { join } from "node:path";
import { AuthError, authenticateHost, type HostDhchapOptions } from "./fabric-auth.ts";
import {
  type ControllerInfo,
  encodeFrame,
  FrameDecoder,
  type Message,
  type NamespaceInfo,
} from "./fabric-protocol.ts";
import { Errno, ErrnoError } from "./rpc-error.ts";
import { closeServer, listenOn, takeSocketPath } from "./unix-socket.ts";

/** A fabric address: what a listener listens on and an initiator connects to. */
export interface FabricAddress {
  /** Canonical transport: "TCP" or "RDMA". */
  readonly trtype: string;
  readonly traddr: string;
  readonly trsvcid: string;
}

/** The shared registry of listeners. Stateless apart from its directory; cheap to create per user. */
export interface SimFabric {
  readonly dir: string;
  /** The unix socket standing for `addr`. */
  socketPath(addr: FabricAddress): string;
  /**
   * Starts listening on `addr`. A stale socket (nothing answers) is replaced; a live one means
   * the address is in use (ErrnoError EBUSY), as a second listen() on a port fails.
   */
  listen(addr: FabricAddress, onConnection: (conn: FabricServerConnection) => void): Promise<FabricListener>;
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
export function createFabric(dir: string): SimFabric {
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
    if (!this.#closed) this.sock.write(encodeFrame(msg, payload));
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
}

/**
 * Connects a controller to the subsystem `opts.subnqn` behind the listener at `opts`. Rejects
 * with FabricConnectError ENODEV when nothing listens there, EIO when the target refuses the
 * connect (unknown subsystem, listener not enabled for it, host not allowed), and the errno of
 * fabric-auth.ts's authenticateHost (ENOKEY, ECONNREFUSED) when DH-HMAC-CHAP fails.
 */
export async function connectController(fabric: SimFabric, opts: ConnectOptions): Promise<FabricController> {
  const path = fabric.socketPath(opts);
  const sock = await new Promise<Socket>((resolve, reject) => {
    const s = netConnect(path);
    s.once("connect", () => resolve(s));
    s.once("error", () => reject(new FabricConnectError(Errno.ENODEV, `nothing listens on ${path}`)));
  });
  const ctrl = new FabricController(sock);
  try {
    await ctrl.handshake(opts);
  } catch (err) {
    ctrl.close();
    throw err;
  }
  return ctrl;
}

/** The initiator's end of a connected controller: identity, namespaces and block I/O. */
export class FabricController {
  readonly #decoder = new FrameDecoder();
  readonly #pending = new Map<
    number,
    { resolve: (f: { msg: Message; payload: Buffer }) => void; reject: (e: Error) => void }
  >();
  #tag = 1;
  #closed = false;
  #ctrlr: ControllerInfo | undefined;
  #namespaces: NamespaceInfo[] = [];
  readonly #nsListeners: ((ns: readonly NamespaceInfo[]) => void)[] = [];
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
      this.#closed = true;
      for (const p of this.#pending.values()) p.reject(new ErrnoError(Errno.EIO, "connection lost"));
      this.#pending.clear();
      for (const fn of this.#closeListeners) fn();
    });
  }

  /** Identify Controller data; set once connected. */
  get ctrlr(): ControllerInfo {
    if (!this.#ctrlr) throw new Error("not connected");
    return this.#ctrlr;
  }

  /** Active namespaces, kept current by the target's notices. */
  get namespaces(): readonly NamespaceInfo[] {
    return this.#namespaces;
  }

  get closed(): boolean {
    return this.#closed;
  }

  /** @internal Sends CONNECT and waits for the verdict. */
  async handshake(opts: ConnectOptions): Promise<void> {
    const connect: Message = {
      op: "connect",
      tag: 0,
      subnqn: opts.subnqn,
      hostnqn: opts.hostnqn,
      hostid: opts.hostid,
      peerAddress: opts.hostaddr ?? opts.traddr,
      // An ephemeral source port, as the kernel would pick one.
      peerPort: String(32768 + Math.floor(Math.random() * 28000)),
    };
    let f = await this.#request(connect);
    if (f.msg.op === "auth_required") {
      try {
        await authenticateHost((m, p) => this.#request(m, p), opts);
      } catch (err) {
        if (err instanceof AuthError) throw new FabricConnectError(err.errno, err.detail);
        throw err;
      }
      f = await this.#request(connect);
    }
    if (f.msg.op === "rejected") throw new FabricConnectError(Errno.EIO, f.msg.reason);
    if (f.msg.op !== "connected") throw new FabricConnectError(Errno.EIO, `unexpected ${f.msg.op}`);
    this.#ctrlr = f.msg.ctrlr;
    this.#namespaces = f.msg.namespaces;
  }

  /** Reads `length` bytes of namespace `nsid` at byte `offset`; ErrnoError on failure. */
  async read(nsid: number, offset: number, length: number): Promise<Buffer> {
    const f = await this.#request({ op: "read", tag: 0, nsid, offset, length });
    if (f.msg.op === "error") throw new ErrnoError(f.msg.errno);
    return f.payload;
  }

  async write(nsid: number, offset: number, data: Uint8Array): Promise<void> {
    const f = await this.#request({ op: "write", tag: 0, nsid, offset }, data);
    if (f.msg.op === "error") throw new ErrnoError(f.msg.errno);
  }

  onNamespaces(fn: (ns: readonly NamespaceInfo[]) => void): void {
    this.#nsListeners.push(fn);
  }

  onClose(fn: () => void): void {
    this.#closeListeners.push(fn);
    if (this.#closed) fn();
  }

  /** Disconnects; idempotent. */
  close(): void {
    this.sock.destroy();
  }

  #request(msg: Message, payload?: Uint8Array): Promise<{ msg: Message; payload: Buffer }> {
    if (this.#closed) return Promise.reject(new ErrnoError(Errno.EIO, "connection lost"));
    const tag = this.#tag++;
    const framed = { ...msg, tag } as Message;
    return new Promise((resolve, reject) => {
      this.#pending.set(tag, { resolve, reject });
      this.sock.write(encodeFrame(framed, payload));
    });
  }

  #dispatch(msg: Message, payload: Buffer): void {
    if (msg.op === "namespaces") {
      this.#namespaces = msg.namespaces;
      for (const fn of this.#nsListeners) fn(msg.namespaces);
      return;
    }
    if (!("tag" in msg)) return;
    const p = this.#pending.get(msg.tag);
    if (!p) return;
    this.#pending.delete(msg.tag);
    p.resolve({ msg, payload });
  }
}
