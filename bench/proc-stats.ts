// What the benches share to drive load and see where it goes: a bounded-concurrency loop and the
// CPU time of one process or of the whole machine, and how long a process's threads waited for a
// CPU, read from /proc.
import { readdirSync, readFileSync } from "node:fs";

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

/**
 * Seconds the threads of process `pid` have spent runnable but waiting for a CPU so far (the
 * scheduler's run-queue delay, second field of /proc/<pid>/task/<tid>/schedstat, summed over the
 * threads alive now); `whenGone` when the process cannot be read. Compared with cpuSeconds over the
 * same interval it says whether a process was slow or starved: a process that waits longer than
 * it runs is held back by the machine's load, not by its own work.
 */
export function runDelaySeconds(pid: number | undefined, whenGone = 0): number {
  if (pid === undefined) return whenGone;
  let tids: string[];
  try {
    tids = readdirSync(`/proc/${pid}/task`);
  } catch {
    return whenGone;
  }
  let ns = 0;
  for (const tid of tids) {
    try {
      ns += Number(readFileSync(`/proc/${pid}/task/${tid}/schedstat`, "utf8").split(" ")[1] ?? 0);
    } catch {
      // the thread ended between the listing and the read
    }
  }
  return ns / 1e9;
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
