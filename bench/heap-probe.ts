// Preloaded into a process a bench measures (bun --preload): on SIGUSR2 it runs full garbage
// collections and writes that process's live JS heap and RSS as JSON to $HEAP_PROBE_FILE.
// Production code never imports it; the bench adds it on the command line.

import { heapStats } from "bun:jsc";
import { renameSync, writeFileSync } from "node:fs";

/** What the probe writes. */
export interface HeapSample {
  /** JS heap in use after full collections (live objects), bytes. */
  heapUsedBytes: number;
  /** The heap the engine holds (live and free), bytes. */
  heapSizeBytes: number;
  objectCount: number;
  rssBytes: number;
  at: number;
}

const file = process.env.HEAP_PROBE_FILE;
if (file) {
  process.on("SIGUSR2", () => {
    for (let i = 0; i < 3; i++) Bun.gc(true);
    const h = heapStats();
    const sample: HeapSample = {
      heapUsedBytes: process.memoryUsage().heapUsed,
      heapSizeBytes: h.heapSize,
      objectCount: h.objectCount,
      rssBytes: process.memoryUsage().rss,
      at: Date.now(),
    };
    writeFileSync(`${file}.tmp`, JSON.stringify(sample));
    // Atomic for the reader: it polls for the file, never sees half of it.
    renameSync(`${file}.tmp`, file);
  });
}
