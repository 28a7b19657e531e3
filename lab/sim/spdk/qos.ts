// bdev QoS as SPDK enforces it (lib/bdev/bdev.c, bdev_qos_*): every 1 ms timeslice each limit
// gets its per-slice budget; an I/O is submitted while every limit that applies to it has budget
// left (it may overdraw, and the deficit carries into the next slice); the rest wait in order.
import type { Clock } from "../../../lib/clock.ts";
import type { RateLimits } from "./bdev.ts";

/** SPDK_BDEV_QOS_TIMESLICE_IN_USEC. */
const TIMESLICE_MS = 1;
/** SPDK_BDEV_QOS_MIN_IO_PER_TIMESLICE and SPDK_BDEV_QOS_MIN_BYTE_PER_TIMESLICE. */
const MIN_IOS_PER_SLICE = 1;
const MIN_BYTES_PER_SLICE = 512;
const MiB = 1024 * 1024;

type Kind = "read" | "write";

interface Budget {
  /** Per timeslice: I/Os or bytes. */
  max: number;
  remaining: number;
  applies(kind: Kind): boolean;
  cost(bytes: number): number;
}

interface Waiter {
  kind: Kind;
  bytes: number;
  resolve(): void;
}

function perSlice(perSecond: number, min: number): number {
  return Math.max(Math.floor((perSecond * TIMESLICE_MS) / 1000), min);
}

/** One bdev's throttle. Limits may change while I/O waits; all-zero limits let everything through. */
export class QosThrottle {
  #budgets: Budget[] = [];
  #queue: Waiter[] = [];
  #sliceStart: number;
  #cancelTimer: (() => void) | undefined;

  constructor(
    private readonly clock: Clock,
    limits: RateLimits,
  ) {
    this.#sliceStart = clock.now();
    this.setLimits(limits);
  }

  /** Replaces the limits (bdev_set_qos_limit); a limit of 0 is none. Budgets restart full. */
  setLimits(l: RateLimits): void {
    const b: Budget[] = [];
    const bytes = (perSec: number, applies: (k: Kind) => boolean) => {
      if (perSec > 0) {
        const max = perSlice(perSec * MiB, MIN_BYTES_PER_SLICE);
        b.push({ max, remaining: max, applies, cost: (n) => n });
      }
    };
    if (l.rw_ios_per_sec > 0) {
      const max = perSlice(l.rw_ios_per_sec, MIN_IOS_PER_SLICE);
      b.push({ max, remaining: max, applies: () => true, cost: () => 1 });
    }
    bytes(l.rw_mbytes_per_sec, () => true);
    bytes(l.r_mbytes_per_sec, (k) => k === "read");
    bytes(l.w_mbytes_per_sec, (k) => k === "write");
    this.#budgets = b;
    this.#sliceStart = this.clock.now();
    this.#drain();
  }

  /** Whether any limit is set. */
  get limited(): boolean {
    return this.#budgets.length > 0;
  }

  /** Resolves when an I/O of `bytes` may be submitted; I/Os are admitted in arrival order. */
  admit(kind: Kind, bytes: number): Promise<void> {
    return new Promise<void>((resolve) => {
      this.#queue.push({ kind, bytes, resolve });
      this.#drain();
    });
  }

  /** Starts the timeslices that passed (unused budget does not accumulate; a deficit is repaid). */
  #refill(): void {
    const slices = Math.floor((this.clock.now() - this.#sliceStart) / TIMESLICE_MS);
    if (slices <= 0) return;
    this.#sliceStart += slices * TIMESLICE_MS;
    for (const b of this.#budgets) b.remaining = Math.min(b.max, b.remaining + slices * b.max);
  }

  #drain(): void {
    this.#refill();
    while (this.#queue.length > 0) {
      const w = this.#queue[0] as Waiter;
      const applicable = this.#budgets.filter((b) => b.applies(w.kind));
      if (applicable.some((b) => b.remaining <= 0)) break;
      for (const b of applicable) b.remaining -= b.cost(w.bytes);
      this.#queue.shift();
      w.resolve();
    }
    if (this.#queue.length > 0 && !this.#cancelTimer) {
      const wait = this.#sliceStart + TIMESLICE_MS - this.clock.now();
      this.#cancelTimer = this.clock.setTimeout(
        () => {
          this.#cancelTimer = undefined;
          this.#drain();
        },
        Math.max(wait, 0),
      );
    }
  }
}
