// The chaos run's consumer: one host holding a path (a fabric controller, lab/sim/spdk/fabric.ts)
// to the volume's NQN on every node that can serve it, writing self-describing blocks through the
// path that is ANA optimized and shows the namespace, and logging every write the target
// acknowledged. A write whose result it did not get (the path died, the target refused it, no
// answer within the bound) is sent again, same block and content, on whichever path serves next.
import type { ConnectOptions, FabricController, SimFabric } from "../sim/spdk/fabric.ts";
import { connectController } from "../sim/spdk/fabric.ts";
import { BLOCK_BYTES, blockContent, WriteLog } from "./write-log.ts";

export interface WriterOptions {
  fabric: SimFabric;
  nqn: string;
  hostnqn: string;
  hostid: string;
  /** Every serving-capable node's address (the copies' nodes); all at `port`. */
  addresses: readonly string[];
  port: number;
  /** Blocks written, from byte 0 of the volume. */
  blocks: number;
  /** Writes in flight at once (each on its own blocks, so one block's writes stay in order). */
  depth: number;
  /** The run's tag in every block. */
  tag: number;
  /** A write not answered within this is treated as unacknowledged and sent again. */
  writeTimeoutMs: number;
  /** Keep Alive Timeout of each path. */
  katoMs: number;
}

export interface WriterStats {
  acknowledged: number;
  attempts: number;
  /** Writes that failed or went unanswered and were sent again. */
  retries: number;
  timeouts: number;
  /** Path (re)connects that succeeded. */
  connects: number;
  /** Times the path used changed from one node to another. */
  pathSwitches: number;
  /** Longest time from a write's first send to its acknowledgement. */
  longestWriteMs: number;
}

class Timeout extends Error {}

/**
 * Runs until stop(); `lastAckAt` tells the caller whether it still makes progress. Connect errors
 * and failed writes never end it: each is retried, at most every 100 ms per path.
 */
export class VolumeWriter {
  readonly log: WriteLog;
  readonly stats: WriterStats = {
    acknowledged: 0,
    attempts: 0,
    retries: 0,
    timeouts: 0,
    connects: 0,
    pathSwitches: 0,
    longestWriteMs: 0,
  };
  lastAckAt = Date.now();
  readonly #paths = new Map<string, FabricController | undefined>();
  readonly #connecting = new Set<string>();
  readonly #lastTry = new Map<string, number>();
  #stopping = false;
  #inFlight = 0;
  #closed = false;
  #workers: Promise<void>[] = [];
  #lastPath: string | undefined;

  constructor(private readonly o: WriterOptions) {
    this.log = new WriteLog(o.blocks);
  }

  start(): void {
    for (let w = 0; w < this.o.depth; w++) this.#workers.push(this.#worker(w));
  }

  async stop(): Promise<void> {
    this.#stopping = true;
    await Promise.all(this.#workers);
  }

  close(): void {
    this.#closed = true;
    for (const c of this.#paths.values()) c?.close();
    this.#paths.clear();
  }

  /** One line on the writer's state (for a stalled run's report). */
  describe(): string {
    const paths = this.o.addresses.map((a) => {
      const c = this.#paths.get(a);
      const state = !c ? "none" : c.closed ? "closed" : `${c.anaState}/${c.namespaces.length} ns`;
      return `${a}=${state}${this.#connecting.has(a) ? " (connecting)" : ""}`;
    });
    return `in flight ${this.#inFlight}, last ack ${Date.now() - this.lastAckAt} ms ago, paths ${paths.join(", ")}`;
  }

  /** The address of the path now serving (optimized, namespace shown), if any. */
  serving(): { address: string; ctrl: FabricController; nsid: number } | undefined {
    if (!this.#closed) this.#reconnect();
    for (const [address, c] of this.#paths) {
      const ns = c?.namespaces[0];
      if (c && !c.closed && c.anaState === "optimized" && ns) return { address, ctrl: c, nsid: ns.nsid };
    }
    return undefined;
  }

  /** Waits (at most `ms`) for a serving path. */
  async servingPath(ms: number): Promise<{ address: string; ctrl: FabricController; nsid: number }> {
    const deadline = Date.now() + ms;
    for (;;) {
      const s = this.serving();
      if (s) return s;
      if (Date.now() > deadline) throw new Error(`no serving path to ${this.o.nqn} within ${ms} ms`);
      await Bun.sleep(50);
    }
  }

  #reconnect(): void {
    const now = Date.now();
    for (const address of this.o.addresses) {
      const c = this.#paths.get(address);
      if ((c && !c.closed) || this.#connecting.has(address)) continue;
      if (now - (this.#lastTry.get(address) ?? 0) < 100) continue;
      this.#lastTry.set(address, now);
      this.#connecting.add(address);
      const opts: ConnectOptions = {
        trtype: "TCP",
        traddr: address,
        trsvcid: String(this.o.port),
        subnqn: this.o.nqn,
        hostnqn: this.o.hostnqn,
        hostid: this.o.hostid,
        kato: this.o.katoMs,
        connectTimeoutMs: 2000,
      };
      connectController(this.o.fabric, opts)
        .then((ctrl) => {
          if (this.#closed) {
            ctrl.close();
            return;
          }
          this.#paths.get(address)?.close();
          this.#paths.set(address, ctrl);
          this.stats.connects++;
        })
        .catch(() => {})
        .finally(() => this.#connecting.delete(address));
    }
  }

  async #worker(w: number): Promise<void> {
    let k = 0;
    const mine = Math.ceil((this.o.blocks - w) / this.o.depth);
    while (!this.#stopping) {
      const block = w + (k++ % mine) * this.o.depth;
      const seq = this.log.next(block);
      const data = blockContent(this.o.tag, block, seq);
      const first = Date.now();
      for (let attempt = 0; ; attempt++) {
        // A write once sent is sent until acknowledged, even while stopping: its outcome must be known.
        if (attempt > 0) {
          this.stats.retries++;
          await Bun.sleep(100);
        }
        let path: { address: string; ctrl: FabricController; nsid: number };
        try {
          path = await this.servingPath(1000);
        } catch {
          if (attempt === 0 && this.#stopping) return;
          continue;
        }
        if (this.#lastPath !== undefined && this.#lastPath !== path.address) this.stats.pathSwitches++;
        this.#lastPath = path.address;
        this.log.attempt(block, seq);
        this.stats.attempts++;
        this.#inFlight++;
        try {
          await this.#bounded(path.ctrl.write(path.nsid, block * BLOCK_BYTES, data));
        } catch (err) {
          if (err instanceof Timeout) {
            // The kernel's timeout handler resets the controller: commands on it are abandoned.
            this.stats.timeouts++;
            path.ctrl.close();
          }
          continue;
        } finally {
          this.#inFlight--;
        }
        this.log.ack(block, seq);
        this.stats.acknowledged++;
        this.lastAckAt = Date.now();
        this.stats.longestWriteMs = Math.max(this.stats.longestWriteMs, this.lastAckAt - first);
        break;
      }
    }
  }

  async #bounded<T>(p: Promise<T>): Promise<T> {
    let timer: ReturnType<typeof setTimeout> | undefined;
    try {
      return await Promise.race([
        p,
        new Promise<never>((_, reject) => {
          timer = setTimeout(() => reject(new Timeout("write timed out")), this.o.writeTimeoutMs);
        }),
      ]);
    } finally {
      clearTimeout(timer);
    }
  }
}
