// Test support: a fresh scratch directory, on tmpfs when the machine has one, since configfs is a
// RAM filesystem too and the crash tests build a hundred trees (on a slow disk that takes seconds).
import { accessSync, constants } from "node:fs";
import { mkdtemp } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";

function scratchParent(): string {
  try {
    accessSync("/dev/shm", constants.W_OK);
    return "/dev/shm";
  } catch {
    return tmpdir();
  }
}

/** Creates a new empty directory whose name starts with `prefix`; the caller removes it. */
export function scratchDir(prefix: string): Promise<string> {
  return mkdtemp(join(scratchParent(), prefix));
}
