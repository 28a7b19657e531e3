// What the lab leaves on the machine and how to take it back: loop devices, mounts and processes,
// inventoried from the kernel's own tables (losetup, /proc/self/mountinfo, /proc/<pid>/cmdline) so
// `lab down` can show the machine before and after and remove everything the lab made.
import { readdirSync, readFileSync, readlinkSync } from "node:fs";

export interface MachineState {
  /** "/dev/loopN -> backing file", sorted. */
  loops: string[];
  /** Mount points, sorted. */
  mounts: string[];
  /** "pid cmdline" of processes whose command line or working directory is under the lab dir. */
  labProcesses: string[];
}

/** Loop devices with their backing files. */
export function loopDevices(): { name: string; backFile: string }[] {
  const p = Bun.spawnSync(["losetup", "--list", "--json", "--output", "NAME,BACK-FILE"]);
  if (p.exitCode !== 0) return [];
  const text = p.stdout.toString().trim();
  if (!text) return [];
  const parsed = JSON.parse(text) as { loopdevices?: { name: string; "back-file": string | null }[] };
  return (parsed.loopdevices ?? []).map((l) => ({ name: l.name, backFile: (l["back-file"] ?? "").trim() }));
}

const unescapeOctal = (p: string) =>
  p.replace(/\\(\d{3})/g, (_, o: string) => String.fromCharCode(Number.parseInt(o, 8)));

/** Mount points with their filesystem types from /proc/self/mountinfo (octal escapes decoded). */
export function mounts(): { path: string; fstype: string }[] {
  return readFileSync("/proc/self/mountinfo", "utf8")
    .split("\n")
    .filter(Boolean)
    .map((l) => {
      const f = l.split(" ");
      // The optional fields end at "-"; the filesystem type follows it.
      const dash = f.indexOf("-");
      return { path: unescapeOctal(f[4] ?? ""), fstype: dash >= 0 ? (f[dash + 1] ?? "") : "" };
    });
}

/** Mount points from /proc/self/mountinfo (octal escapes decoded). */
export function mountPoints(): string[] {
  return mounts().map((m) => m.path);
}

/** Processes (not this one) whose argv or cwd mentions `dir`. */
export function processesUnder(dir: string): { pid: number; cmd: string }[] {
  const out: { pid: number; cmd: string }[] = [];
  for (const e of readdirSync("/proc")) {
    const pid = Number(e);
    if (!Number.isInteger(pid) || pid === process.pid) continue;
    try {
      const cmd = readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0").filter(Boolean).join(" ");
      let cwd = "";
      try {
        cwd = readlinkSync(`/proc/${pid}/cwd`);
      } catch {}
      if (cmd.includes(dir) || cwd === dir || cwd.startsWith(`${dir}/`)) out.push({ pid, cmd });
    } catch {
      // The process ended while we looked.
    }
  }
  return out;
}

export function machineState(dir: string): MachineState {
  return {
    loops: loopDevices()
      .map((l) => `${l.name} -> ${l.backFile}`)
      .sort(),
    mounts: mountPoints().sort(),
    labProcesses: processesUnder(dir)
      .map((p) => `${p.pid} ${p.cmd.slice(0, 160)}`)
      .sort(),
  };
}

/**
 * Removes what the lab made under `dir`: kills its processes (SIGKILL: the orderly stop already
 * happened or its owner is gone), unmounts every mount point below it (deepest first, lazily if
 * busy) and detaches every loop device whose backing file is below it. Idempotent; returns what
 * it removed.
 */
export async function sweepLab(
  dir: string,
): Promise<{ killed: number; unmounted: number; detached: number }> {
  let killed = 0;
  for (let round = 0; round < 5; round++) {
    const procs = processesUnder(dir);
    if (procs.length === 0) break;
    for (const p of procs) {
      try {
        process.kill(p.pid, "SIGKILL");
        killed++;
      } catch {}
    }
    await Bun.sleep(200);
  }
  let unmounted = 0;
  const under = (p: string) => p === dir || p.startsWith(`${dir}/`);
  for (let round = 0; round < 5; round++) {
    const mine = mounts()
      .filter((m) => under(m.path))
      .sort((a, b) => b.path.length - a.path.length);
    if (mine.length === 0) break;
    for (const m of mine) {
      // A lab host's FUSE mount whose server is gone or hung would block a plain umount (and
      // anything that stats it): detach it lazily, which also ends its connection.
      if (m.fstype.startsWith("fuse")) {
        Bun.spawnSync(["umount", "-l", m.path]);
      } else {
        const r = Bun.spawnSync(["umount", m.path]);
        if (r.exitCode !== 0) Bun.spawnSync(["umount", "-l", m.path]);
      }
      unmounted++;
    }
  }
  let detached = 0;
  for (const l of loopDevices()) {
    const file = l.backFile.replace(/ \(deleted\)$/, "");
    if (!under(file)) continue;
    if (Bun.spawnSync(["losetup", "-d", l.name]).exitCode === 0) detached++;
  }
  return { killed, unmounted, detached };
}

/** Lines describing how `after` differs from `before`; empty when the machine is as it was. */
export function stateDiff(before: MachineState, after: MachineState): string[] {
  const diff: string[] = [];
  for (const k of ["loops", "mounts", "labProcesses"] as const) {
    const b = new Set(before[k]);
    const a = new Set(after[k]);
    for (const x of a) if (!b.has(x)) diff.push(`+ ${k}: ${x}`);
    for (const x of b) if (!a.has(x)) diff.push(`- ${k}: ${x}`);
  }
  return diff;
}
