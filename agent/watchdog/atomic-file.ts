// Writes a small file atomically: a temporary file beside it, then rename over it, so a reader
// sees the old content or the new, never a part.
import { rename, rm, writeFile } from "node:fs/promises";

let seq = 0;

/** Writes `text` to `path` by tmp + rename. Rejects with the write's error (the tmp file removed). */
export async function writeFileAtomic(path: string, text: string): Promise<void> {
  const tmp = `${path}.tmp-${process.pid}-${++seq}`;
  try {
    await writeFile(tmp, text, { mode: 0o644 });
    await rename(tmp, path);
  } catch (err) {
    await rm(tmp, { force: true }).catch(() => {});
    throw err;
  }
}
