// What the benches share to drive load and see where it goes: a bounded-concurrency loop and the
// CPU time of one process or of the whole machine, read from /proc.
import { readFileSync } from "node:fs";

/** Runs `fn` over `items` with at most `n` in flight; rejects with the first failure. */
export async function pool<T>(
  items: readonly T[],
  n: number,
  fn: (x: T, i: number) => Promise<void>,
): Promise<void> {
  let next = 0;
  await Promise.all(
    Array.from({ length: Math.min(n, items.length) }, async () => {
      for (let i = next++; i < items.length; i = next++) await fn(items[i] as T, i);
    }),
  );
}

/** CPU seconds (user + system) process `pid` has used so far; `whenGone` when it cannot be read. */
export function cpuSeconds(pid: number | undefined, whenGone = 0): number {
  if (pid === undefined) return whenGone;
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    return (Number(f[11]) + Number(f[12])) / 100; // USER_HZ is 100 on Linux
  } catch {
    return whenGone;
  }
}

/** Busy CPU seconds of the whole machine so far: every process, other users' included. */
export function machineBusySeconds(): number {
  const f = (readFileSync("/proc/stat", "utf8").split("\n")[0] ?? "")
    .trim()
    .split(/\s+/)
    .slice(1)
    .map(Number);
  return (f.slice(0, 8).reduce((a, b) => a + b, 0) - (f[3] ?? 0) - (f[4] ?? 0)) / 100;
}
