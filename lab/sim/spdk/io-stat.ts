// A bdev's I/O statistics as SPDK's bdev layer keeps them (struct spdk_bdev_io_stat): bytes, ops
// and latency ticks per kind of I/O, with min/max, printed the way spdk_bdev_dump_io_stat_json does.
import type { JsonValue } from "./json-stream.ts";

/** The four I/O kinds bdev_get_iostat reports. */
export type IoKind = "read" | "write" | "unmap" | "copy";

const KINDS: readonly IoKind[] = ["read", "write", "unmap", "copy"];
const BYTES_KEY: Record<IoKind, string> = {
  read: "bytes_read",
  write: "bytes_written",
  unmap: "bytes_unmapped",
  copy: "bytes_copied",
};

interface PerKind {
  bytes: number;
  ops: number;
  ticks: number;
  max: number;
  /** Infinity until the first I/O: SPDK's UINT64_MAX, printed as 0. */
  min: number;
}

function fresh(): PerKind {
  return { bytes: 0, ops: 0, ticks: 0, max: 0, min: Number.POSITIVE_INFINITY };
}

/** Completed I/O of one bdev since it was registered (or since the last reset). */
export class IoStat {
  #k: Record<IoKind, PerKind> = { read: fresh(), write: fresh(), unmap: fresh(), copy: fresh() };
  /** Failed I/O counts by SPDK's status name ("failed", "aio_error", ...); printed when non-zero. */
  #errors = new Map<string, number>();

  /** Counts one successful I/O of `bytes` that took `ticks` from submission to completion. */
  complete(kind: IoKind, bytes: number, ticks: number): void {
    const k = this.#k[kind];
    k.bytes += bytes;
    k.ops++;
    k.ticks += ticks;
    k.max = Math.max(k.max, ticks);
    k.min = Math.min(k.min, ticks);
  }

  /** Counts one I/O that completed with an error status (SPDK: SPDK_BDEV_IO_STATUS_FAILED). */
  fail(status = "failed"): void {
    this.#errors.set(status, (this.#errors.get(status) ?? 0) + 1);
  }

  /** True once any I/O was counted: the bdev has had an I/O channel. */
  get touched(): boolean {
    return KINDS.some((k) => this.#k[k].ops > 0) || this.#errors.size > 0;
  }

  /** reset_mode "all" zeroes everything; "maxmin" only the extremes (bdev_reset_iostat's modes). */
  reset(mode: "all" | "maxmin"): void {
    for (const kind of KINDS) {
      const k = this.#k[kind];
      if (mode === "all") this.#k[kind] = fresh();
      else {
        k.max = 0;
        k.min = Number.POSITIVE_INFINITY;
      }
    }
    if (mode === "all") this.#errors.clear();
  }

  /** The keys of spdk_bdev_dump_io_stat_json in its order; `io_error` only when asked for. */
  toJson(withErrors: boolean): { [key: string]: JsonValue } {
    const out: { [key: string]: JsonValue } = {};
    for (const kind of KINDS) {
      out[BYTES_KEY[kind]] = this.#k[kind].bytes;
      out[`num_${kind}_ops`] = this.#k[kind].ops;
    }
    for (const kind of KINDS) {
      const k = this.#k[kind];
      out[`${kind}_latency_ticks`] = Math.round(k.ticks);
      out[`max_${kind}_latency_ticks`] = Math.round(k.max);
      out[`min_${kind}_latency_ticks`] = k.min === Number.POSITIVE_INFINITY ? 0 : Math.round(k.min);
    }
    if (withErrors) out.io_error = Object.fromEntries(this.#errors);
    return out;
  }
}
