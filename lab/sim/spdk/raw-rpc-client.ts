// Test support: a deliberately dumb JSON-RPC peer for the emulator's socket that sends exact bytes
// and records exactly what comes back (including unterminated fragments and closed connections),
// so tests exercise framing without the production client.
import { connect, type Socket } from "node:net";

/** One raw connection. All waits are bounded by their timeouts and never throw on timeout. */
export class RawRpcConnection {
  #data = "";
  #closed = false;
  readonly #waiters: (() => void)[] = [];

  private constructor(private readonly sock: Socket) {
    sock.setEncoding("utf8");
    sock.on("data", (d: string) => {
      this.#data += d;
      this.#wake();
    });
    sock.on("close", () => {
      this.#closed = true;
      this.#wake();
    });
    sock.on("error", () => {});
  }

  /** Connects to `path`; rejects with the connect error (ENOENT, ECONNREFUSED...). */
  static connect(path: string): Promise<RawRpcConnection> {
    return new Promise((resolve, reject) => {
      const s = connect(path);
      s.once("connect", () => resolve(new RawRpcConnection(s)));
      s.once("error", reject);
    });
  }

  /** Everything received so far. */
  get received(): string {
    return this.#data;
  }

  get closed(): boolean {
    return this.#closed;
  }

  send(bytes: string | Uint8Array): void {
    this.sock.write(bytes);
  }

  /** Waits until `n` newline-terminated replies arrived (or the timeout); returns them parsed. */
  async replies(n: number, timeoutMs = 2000): Promise<unknown[]> {
    await this.#until(() => this.#data.split("\n").length - 1 >= n || this.#closed, timeoutMs);
    return this.#data
      .split("\n")
      .slice(0, -1)
      .map((l) => JSON.parse(l) as unknown);
  }

  /** Waits for the first bytes, then until nothing new arrived for `idleMs` (or the connection closed). */
  async settle(idleMs = 50, timeoutMs = 2000): Promise<string> {
    const deadline = Date.now() + timeoutMs;
    await this.#until(() => this.#data.length > 0 || this.#closed, timeoutMs);
    let seen = -1;
    while (Date.now() < deadline && !this.#closed && seen !== this.#data.length) {
      seen = this.#data.length;
      await Bun.sleep(idleMs);
    }
    return this.#data;
  }

  /** True when the server closed the connection within `timeoutMs`. */
  async waitClosed(timeoutMs = 1000): Promise<boolean> {
    await this.#until(() => this.#closed, timeoutMs);
    return this.#closed;
  }

  close(): void {
    this.sock.destroy();
  }

  #wake(): void {
    for (const w of this.#waiters.splice(0)) w();
  }

  async #until(cond: () => boolean, timeoutMs: number): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (!cond()) {
      const left = deadline - Date.now();
      if (left <= 0) return;
      await new Promise<void>((resolve) => {
        const t = setTimeout(resolve, left);
        this.#waiters.push(() => {
          clearTimeout(t);
          resolve();
        });
      });
    }
  }
}

/**
 * Sends one request on a fresh connection and resolves with the parsed reply object.
 * `params` undefined omits the member, as clients should.
 */
export async function rpc(
  socketPath: string,
  method: string,
  params?: unknown,
  id: number | string = 1,
): Promise<{
  id: unknown;
  result?: unknown;
  error?: { code: number; message: string };
}> {
  const c = await RawRpcConnection.connect(socketPath);
  try {
    c.send(
      JSON.stringify(
        params === undefined ? { jsonrpc: "2.0", method, id } : { jsonrpc: "2.0", method, id, params },
      ),
    );
    const [reply] = await c.replies(1, 5000);
    if (!reply) throw new Error(`no reply to ${method}`);
    return reply as { id: unknown; result?: unknown; error?: { code: number; message: string } };
  } finally {
    c.close();
  }
}

/** Like rpc() but returns `result`, throwing with the error's code and message otherwise. */
export async function call(socketPath: string, method: string, params?: unknown): Promise<unknown> {
  const r = await rpc(socketPath, method, params);
  if (r.error) throw new Error(`${method}: ${r.error.code} ${r.error.message}`);
  return r.result;
}
