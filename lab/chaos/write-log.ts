// The chaos writer's record of what it wrote, and the check of a volume's bytes against it. Each
// block's content names itself (run tag, block, sequence number) and is filled with bytes derived
// from those, so a block read back says which write it holds and whether it is intact.
import { createHash } from "node:crypto";

export const BLOCK_BYTES = 4096;
const MAGIC = 0x43484153; // "CHAS"
const HEADER = 16;

/** The content of write `seq` (>= 1) of `block` in run `tag` (a 32-bit number). */
export function blockContent(tag: number, block: number, seq: number): Buffer {
  const b = Buffer.alloc(BLOCK_BYTES);
  b.writeUInt32LE(MAGIC, 0);
  b.writeUInt32LE(tag >>> 0, 4);
  b.writeUInt32LE(block, 8);
  b.writeUInt32LE(seq, 12);
  // The rest from a hash chain over the header, so a torn or shifted block does not parse.
  let h = createHash("sha256").update(b.subarray(0, HEADER)).digest();
  for (let o = HEADER; o < BLOCK_BYTES; o += h.length) {
    h.copy(b, o, 0, Math.min(h.length, BLOCK_BYTES - o));
    h = createHash("sha256").update(h).digest();
  }
  return b;
}

/**
 * What a block read back holds: "zero" (never written), the sequence number of an intact write
 * of this block in this run, or "garbage" (anything else: torn, another block's, another run's).
 */
export function parseBlock(
  tag: number,
  block: number,
  data: Buffer,
): { kind: "zero" } | { kind: "seq"; seq: number } | { kind: "garbage" } {
  if (data.length !== BLOCK_BYTES) return { kind: "garbage" };
  if (data.every((x) => x === 0)) return { kind: "zero" };
  if (data.readUInt32LE(0) !== MAGIC || data.readUInt32LE(4) !== tag >>> 0 || data.readUInt32LE(8) !== block)
    return { kind: "garbage" };
  const seq = data.readUInt32LE(12);
  return seq >= 1 && blockContent(tag, block, seq).equals(data) ? { kind: "seq", seq } : { kind: "garbage" };
}

/**
 * Per block: the last acknowledged sequence number and the highest attempted one. Writes of one
 * block are issued one at a time in sequence order, so any number between the two was attempted
 * and may or may not have landed.
 */
export class WriteLog {
  readonly #acked: number[];
  readonly #attempted: number[];
  acknowledged = 0;
  attempts = 0;

  constructor(readonly blocks: number) {
    this.#acked = new Array(blocks).fill(0);
    this.#attempted = new Array(blocks).fill(0);
  }

  /** The next sequence number to write to `block`. */
  next(block: number): number {
    return (this.#attempted[block] ?? 0) + 1;
  }

  /** A write of `seq` to `block` is about to be sent (again, when retried). */
  attempt(block: number, seq: number): void {
    this.attempts++;
    if (seq > (this.#attempted[block] ?? 0)) this.#attempted[block] = seq;
  }

  /** The initiator completed the write of `seq` to `block` successfully. */
  ack(block: number, seq: number): void {
    this.acknowledged++;
    if (seq > (this.#acked[block] ?? 0)) this.#acked[block] = seq;
  }

  acked(block: number): number {
    return this.#acked[block] ?? 0;
  }

  attempted(block: number): number {
    return this.#attempted[block] ?? 0;
  }
}

export interface BlockFinding {
  block: number;
  acked: number;
  attempted: number;
  found: string;
}

/**
 * Checks one block's bytes: it must hold its last acknowledged write or a later attempted one
 * (zero only when no write was acknowledged). Returns the finding when it does not.
 */
export function checkBlock(
  log: WriteLog,
  tag: number,
  block: number,
  data: Buffer,
): BlockFinding | undefined {
  const acked = log.acked(block);
  const attempted = log.attempted(block);
  const got = parseBlock(tag, block, data);
  const bad = (found: string) => ({ block, acked, attempted, found });
  if (got.kind === "garbage") return bad("garbage");
  if (got.kind === "zero") return acked === 0 ? undefined : bad("zeros");
  if (got.seq < acked) return bad(`seq ${got.seq} (older than the acknowledged one)`);
  if (got.seq > attempted) return bad(`seq ${got.seq} (never attempted)`);
  return undefined;
}
