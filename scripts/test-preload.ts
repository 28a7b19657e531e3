// Preloaded into every `bun test` run (bunfig.toml). Under `bun run test:unit`, which sets
// DISTORT_UNIT_TMPFS=1, scratch files go to /dev/shm when it is writable, has room and TMPDIR was
// not chosen already: the unit tier writes a few hundred MiB of drive images, lvol files and
// workload patterns, and a RAM filesystem spares them the disk's block allocation (the I/O-heavy
// files run ~25% faster on the 2-core lab machine). Subprocesses keep the inherited TMPDIR.
import { accessSync, constants, statfsSync } from "node:fs";

const TMPFS = "/dev/shm";
/** Sparse images are mostly holes; this leaves room for what is written plus everyone else's use. */
const MIN_FREE_BYTES = 4 * 1024 ** 3;

if (process.env.DISTORT_UNIT_TMPFS === "1" && !process.env.TMPDIR) {
  try {
    accessSync(TMPFS, constants.W_OK);
    const fs = statfsSync(TMPFS);
    if (fs.bavail * fs.bsize >= MIN_FREE_BYTES) process.env.TMPDIR = TMPFS;
  } catch {
    // No usable tmpfs: the default temporary directory serves.
  }
}
