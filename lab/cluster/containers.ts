// DISTORT's processes on the host as /proc shows them, with the cgroup each one runs in: how the
// real-cluster lab's tests find a Pod's container process on a node (its cgroup lies under the
// node's cgroup root /dlab-<node>, in the Pod's pod<uid> cgroup) to check or kill it.
import { readdirSync, readFileSync } from "node:fs";

/** One host process whose command line names a DISTORT binary or entry point. */
export interface DistortProcess {
  pid: number;
  ppid: number;
  /** The command line, arguments joined by spaces. */
  cmd: string;
  /** /proc/<pid>/cgroup as read. */
  cgroup: string;
}

const DISTORT_COMMAND =
  /(^|\/)(distort-(agent|agent-kernel-lab|csi|csi-lab|manager|dpu))(\s|$)|(^|\/)nvmf_tgt(\s|$)|(agent|manager|csi|dpu)\/main\.ts|lab\/(csi-node|kernel-agent)\.ts|sim\/spdk\/nvmf-tgt\.ts/;

/** Every host process whose command line names a DISTORT binary or a DISTORT entry point. */
export function distortProcesses(): DistortProcess[] {
  const out: DistortProcess[] = [];
  for (const e of readdirSync("/proc")) {
    if (!/^\d+$/.test(e)) continue;
    try {
      const cmd = readFileSync(`/proc/${e}/cmdline`, "utf8").split("\0").join(" ").trim();
      if (!DISTORT_COMMAND.test(cmd)) continue;
      const stat = readFileSync(`/proc/${e}/stat`, "utf8");
      const rest = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
      if (rest[0] === "Z") continue;
      out.push({
        pid: Number(e),
        ppid: Number(rest[1]),
        cmd,
        cgroup: readFileSync(`/proc/${e}/cgroup`, "utf8"),
      });
    } catch {
      // The process ended while being read.
    }
  }
  return out;
}

/** Where a container process is: on which node (cgroup root /dlab-<node>), in which Pod (its UID). */
export interface ContainerPlace {
  node: string;
  /** The Pod's UID, when the process must belong to one Pod (e.g. one of several manager replicas). */
  podUid?: string;
}

/**
 * The main process of the container whose command line matches `command`, on `where`: of the
 * matching processes, the one whose parent does not match too. Undefined while none runs.
 */
export function containerProcess(command: RegExp, where: ContainerPlace): number | undefined {
  const inPlace = distortProcesses().filter(
    (p) =>
      command.test(p.cmd) &&
      p.cgroup.includes(`/dlab-${where.node}/`) &&
      (where.podUid === undefined || p.cgroup.includes(`pod${where.podUid}`)),
  );
  const pids = new Set(inPlace.map((p) => p.pid));
  const roots = inPlace.filter((p) => !pids.has(p.ppid)).map((p) => p.pid);
  return roots.length > 0 ? Math.min(...roots) : undefined;
}

/**
 * Pids of the processes of one container, by its CRI container ID (a Pod status's containerID
 * without the `containerd://` prefix): the cgroup path kubelet gives it ends in that ID.
 */
export function containerPids(containerId: string): number[] {
  const id = containerId.replace(/^[a-z]+:\/\//, "");
  const out: number[] = [];
  for (const e of readdirSync("/proc")) {
    if (!/^\d+$/.test(e)) continue;
    try {
      if (readFileSync(`/proc/${e}/cgroup`, "utf8").includes(`/${id}\n`)) out.push(Number(e));
    } catch {
      // The process ended while being read.
    }
  }
  return out.sort((a, b) => a - b);
}
