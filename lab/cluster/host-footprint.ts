// A listing of the host state a lab may change (lab processes, mounts, loop devices, network
// namespaces, links, routes, iptables in both backends, top cgroup levels, kubelet/CNI sysctls)
// and the difference of two listings as lines: how `lab down` proves it left the machine as found.
import { existsSync, readdirSync, readFileSync, readlinkSync, statSync } from "node:fs";
import { join } from "node:path";

/** What a listing holds: each section a sorted list of lines, sysctls a key -> value map. */
export interface HostFootprint {
  processes: string[];
  mounts: string[];
  loops: string[];
  netns: string[];
  links: string[];
  routes: string[];
  iptables: string[];
  cgroups: string[];
  sysctls: Record<string, string>;
}

/** What the process filter sees of one process. */
export interface ProcessInfo {
  pid: number;
  comm: string;
  cmdline: string;
  /** /proc/<pid>/cgroup, one line per hierarchy. */
  cgroup: string;
  mntns: string;
  netns: string;
}

/** comm names of the binaries a lab runs (comm is cut at 15 characters). */
export const LAB_COMMS = new Set([
  "etcd",
  "kube-apiserver",
  "kube-controller",
  "kube-scheduler",
  "kubelet",
  "kube-proxy",
  "containerd",
  "containerd-shim",
  "runc",
  "ctr",
]);

/** The default process filter: a lab binary, or anything in a kubelet-made cgroup or a lab node's cgroup root. */
export function isLabProcess(p: ProcessInfo): boolean {
  return LAB_COMMS.has(p.comm) || /:\/(dlab-[^/\n]*|kubepods)(\/|$)/m.test(p.cgroup);
}

/** Control-plane binaries an integration test on the same machine also runs, each with its own state. */
const CONTROL_PLANE_COMMS = new Set(["etcd", "kube-apiserver", "kube-controller", "kube-scheduler"]);

/**
 * The processes of one real-cluster lab: isLabProcess, except a control-plane process whose
 * command line does not name `marker` (the lab's state directory, or its prefix), which belongs
 * to another control plane on the machine (an integration test's) and comes and goes with it.
 */
export function labProcessOf(marker: string): (p: ProcessInfo) => boolean {
  return (p) => isLabProcess(p) && (!CONTROL_PLANE_COMMS.has(p.comm) || p.cmdline.includes(marker));
}

/** Sysctls kubelet, CNI plugins or kube-proxy may write; net.bridge.* are added when present. */
export const FOOTPRINT_SYSCTLS = [
  "kernel.panic",
  "kernel.panic_on_oops",
  "vm.overcommit_memory",
  "vm.panic_on_oom",
  "kernel.keys.root_maxkeys",
  "kernel.keys.root_maxbytes",
  "net.ipv4.ip_forward",
  "net.ipv4.conf.all.route_localnet",
  "net.netfilter.nf_conntrack_max",
  "net.netfilter.nf_conntrack_tcp_timeout_established",
  "net.netfilter.nf_conntrack_tcp_timeout_close_wait",
];

/**
 * processFilter picks the processes listed (default isLabProcess); loop devices whose backing file
 * and mounts whose mount point `otherLab` claims belong to another lab on the machine (e.g. a
 * harness lab an integration test runs meanwhile) and are not listed.
 */
export interface SnapshotOptions {
  processFilter?: (p: ProcessInfo) => boolean;
  otherLab?: (path: string) => boolean;
}

const read = (p: string) => {
  try {
    return readFileSync(p, "utf8");
  } catch {
    return "";
  }
};

function command(argv: string[]): string {
  try {
    const p = Bun.spawnSync(argv, { stdout: "pipe", stderr: "pipe" });
    return p.exitCode === 0 ? p.stdout.toString() : "";
  } catch {
    return "";
  }
}

function processes(filter: (p: ProcessInfo) => boolean): string[] {
  const out: string[] = [];
  for (const e of readdirSync("/proc")) {
    if (!/^\d+$/.test(e)) continue;
    const pid = Number(e);
    if (pid === process.pid) continue;
    let mntns = "";
    let netns = "";
    try {
      mntns = readlinkSync(`/proc/${e}/ns/mnt`);
      netns = readlinkSync(`/proc/${e}/ns/net`);
    } catch {
      continue;
    }
    const info: ProcessInfo = {
      pid,
      comm: read(`/proc/${e}/comm`).trim(),
      cmdline: read(`/proc/${e}/cmdline`).replaceAll("\0", " ").trim(),
      cgroup: read(`/proc/${e}/cgroup`),
      mntns,
      netns,
    };
    if (info.comm && filter(info)) out.push(`${pid} ${info.comm}`);
  }
  return out;
}

/** mountinfo without the per-boot mount ids: mount point, root, optional (propagation) fields, type, source. */
export function mountLines(mountinfo: string): string[] {
  return mountinfo
    .split("\n")
    .filter(Boolean)
    .map((l) => {
      const [pre, post = ""] = l.split(" - ");
      const f = (pre ?? "").split(" ");
      const [fstype, source] = post.split(" ");
      return [f[4], f[3], ...f.slice(6), "-", fstype, source].join(" ");
    });
}

function loops(otherLab: (path: string) => boolean): string[] {
  if (!existsSync("/sys/block")) return [];
  return readdirSync("/sys/block")
    .filter((d) => d.startsWith("loop"))
    .map((d) => ({ d, b: read(`/sys/block/${d}/loop/backing_file`).trim() }))
    .filter((x) => x.b !== "" && !otherLab(x.b))
    .map((x) => `${x.d} ${x.b}`);
}

/** iptables-save output without counters and comments, each rule prefixed with its tool and table. */
export function iptablesLines(tool: string, save: string): string[] {
  const out: string[] = [];
  let table = "";
  for (const raw of save.split("\n")) {
    const l = raw.trim();
    if (!l || l.startsWith("#")) continue;
    if (l.startsWith("*")) {
      table = l.slice(1);
      continue;
    }
    if (l === "COMMIT") continue;
    out.push(`${tool} ${table} ${l.replace(/ \[\d+:\d+\]$/, "")}`);
  }
  return out;
}

function cgroups(): string[] {
  const out: string[] = [];
  const root = "/sys/fs/cgroup";
  if (!existsSync(root)) return out;
  const dirs = (p: string) => {
    try {
      return readdirSync(p, { withFileTypes: true })
        .filter((e) => e.isDirectory())
        .map((e) => e.name);
    } catch {
      return [];
    }
  };
  for (const h of dirs(root)) {
    for (const a of dirs(join(root, h))) {
      // The machine's own job runner makes a cgroup per command it runs; nothing of a lab.
      if (a === "process_api") continue;
      out.push(`${h}/${a}`);
      for (const b of dirs(join(root, h, a))) out.push(`${h}/${a}/${b}`);
    }
  }
  return out;
}

function sysctls(): Record<string, string> {
  const keys = [...FOOTPRINT_SYSCTLS];
  if (existsSync("/proc/sys/net/bridge")) {
    for (const f of readdirSync("/proc/sys/net/bridge")) keys.push(`net.bridge.${f}`);
  }
  const out: Record<string, string> = {};
  for (const k of keys) {
    const p = `/proc/sys/${k.replaceAll(".", "/")}`;
    if (existsSync(p) && statSync(p).isFile()) out[k] = read(p).trim();
  }
  return out;
}

/** Takes the listing now. Tools that are missing (e.g. no legacy iptables) contribute nothing. */
export function snapshotHost(opts: SnapshotOptions = {}): HostFootprint {
  const ipt: string[] = [];
  for (const tool of [
    "iptables-nft-save",
    "iptables-legacy-save",
    "ip6tables-nft-save",
    "ip6tables-legacy-save",
  ]) {
    ipt.push(...iptablesLines(tool, command([tool])));
  }
  const sorted = (xs: string[]) => [...xs].sort();
  const otherLab = opts.otherLab ?? (() => false);
  return {
    processes: sorted(processes(opts.processFilter ?? isLabProcess)),
    mounts: sorted(mountLines(read("/proc/self/mountinfo")).filter((m) => !otherLab(m.split(" ")[0] ?? ""))),
    loops: sorted(loops(otherLab)),
    netns: sorted(
      command(["ip", "netns", "list"])
        .split("\n")
        .map((l) => l.split(" ")[0] ?? "")
        .filter(Boolean),
    ),
    links: sorted(
      command(["ip", "-o", "link", "show"])
        .split("\n")
        .map((l) => l.split(": ")[1]?.split("@")[0] ?? "")
        .filter(Boolean),
    ),
    routes: sorted(
      command(["ip", "-o", "-4", "route", "show", "table", "all"])
        .split("\n")
        .map((l) => l.trim())
        .filter(Boolean),
    ),
    iptables: sorted(ipt),
    cgroups: sorted(cgroups()),
    sysctls: sysctls(),
  };
}

const LIST_SECTIONS = [
  "processes",
  "mounts",
  "loops",
  "netns",
  "links",
  "routes",
  "iptables",
  "cgroups",
] as const;

/**
 * The differences between two listings, one line each: `+ section: line` for what appeared,
 * `- section: line` for what went, `~ sysctl key: before -> after` for a changed value. Repeated
 * lines count (two equal mounts stacked are not one). Empty when the host is as it was.
 */
export function diffFootprints(before: HostFootprint, after: HostFootprint): string[] {
  const out: string[] = [];
  for (const section of LIST_SECTIONS) {
    const count = new Map<string, number>();
    for (const l of before[section]) count.set(l, (count.get(l) ?? 0) + 1);
    for (const l of after[section]) count.set(l, (count.get(l) ?? 0) - 1);
    for (const [l, n] of [...count].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))) {
      for (let i = 0; i < Math.abs(n); i++) out.push(`${n > 0 ? "-" : "+"} ${section}: ${l}`);
    }
  }
  const keys = [...new Set([...Object.keys(before.sysctls), ...Object.keys(after.sysctls)])].sort();
  for (const k of keys) {
    const a = before.sysctls[k];
    const b = after.sysctls[k];
    if (a !== b) out.push(`~ sysctl ${k}: ${a ?? "(absent)"} -> ${b ?? "(absent)"}`);
  }
  return out;
}
