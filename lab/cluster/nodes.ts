// Real Kubernetes nodes on this machine: per node a network namespace, a mount-namespace holder
// whose bind mounts give the node its own /run, /var/lib, /var/log and kubelet sysctls, a cgroup
// root, containerd 1.6, kubelet and kube-proxy. Handles start, fault (kill -9), restart and tear
// down each node; teardownNodes(dir) cleans up from the recorded state after a crash as well.
import {
  closeSync,
  type Dirent,
  existsSync,
  mkdirSync,
  openSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  rmdirSync,
  statSync,
  writeFileSync,
} from "node:fs";
import { join } from "node:path";
import type { Subprocess } from "bun";
import { type ControlPlane, signClientCertificate } from "./control-plane.ts";
import {
  addNodeNetwork,
  LAB_BLOCK,
  netnsName,
  nodeAddressing,
  removeNodeNetwork,
  teardownNetwork,
} from "./node-network.ts";
import { importImage } from "./oci-image.ts";
import { cacheRoot, KUBE_VERSION } from "./tools.ts";

/** One node to start. */
export interface NodeSpec {
  /** Node name: also the Kubernetes Node's name; [a-z0-9-], at most 20 characters. */
  name: string;
  labels?: Record<string, string>;
  /** 1-based address index (node IP 198.18.0.(10+i), Pod CIDR 198.19.i.0/24); default: position + 1. */
  index?: number;
}

/** Options shared by all nodes of one startNodes call. */
export interface StartNodesOptions {
  /** The lab directory; node state goes to <dir>/nodes/<node>. Not under /run, /var/lib or /var/log. */
  dir: string;
  /** containerd's sandbox image ("distort.lab/pause:<tag>"); one of `images` must provide it. */
  sandboxImage: string;
  /** OCI archives imported into every node's containerd before its kubelet starts. */
  images?: string[];
  progress?: (line: string) => void;
  tools?: NodeToolPaths;
  /** Deadline for each node's Node object to turn Ready after its kubelet starts (default 180 s). */
  readyTimeoutMs?: number;
}

/** The node-level binaries: kubelet and kube-proxy (Go builds), containerd, the CNI plugin directory. */
export interface NodeToolPaths {
  kubelet: string;
  kubeProxy: string;
  containerd: string;
  cniBinDir: string;
}

/** Where build-tools.sh puts kubelet and kube-proxy; containerd and CNI plugins are Debian's. */
export function nodeToolPaths(root = cacheRoot()): NodeToolPaths {
  const kube = join(root, "kube", KUBE_VERSION);
  return {
    kubelet: join(kube, "kubelet"),
    kubeProxy: join(kube, "kube-proxy"),
    containerd: "/usr/bin/containerd",
    cniBinDir: "/usr/lib/cni",
  };
}

/** The outcome of LabNode.exec. */
export interface ExecResult {
  exitCode: number;
  stdout: string;
  stderr: string;
}

/** Host pids of a node's daemons; a daemon that is not running is absent. */
export interface NodePids {
  holder: number;
  containerd?: number;
  kubelet?: number;
  kubeProxy?: number;
}

/** A running node, as startNodes returns it. */
export interface LabNode {
  name: string;
  index: number;
  ip: string;
  podCidr: string;
  /** Network namespace name (`/run/netns/<netns>` on the host). */
  netns: string;
  /** The mount-namespace holder; the node's mount namespace is /proc/<holderPid>/ns/mnt. */
  holderPid: number;
  /** Host-visible paths of the node's directories: what the node sees as /var/lib, /run, /var/log. */
  paths: { root: string; varLib: string; run: string; varLog: string; logs: string; conf: string };
  /** containerd's socket as the host reaches it (for `ctr --address`, importImage). */
  containerdSocket: string;
  cgroupRoot: string;
  /** Runs argv inside the node (its network and mount namespace); never throws on a non-zero exit. */
  exec(argv: string[], opts?: { stdin?: string }): Promise<ExecResult>;
  /** Pids of the node's daemons that are running now. */
  pids(): NodePids;
  /** kill -9 of kubelet and containerd (a node crash; shims and Pods keep running). Resolves once both exited. */
  kill(): Promise<void>;
  /** Starts containerd, kubelet and kube-proxy where they are not running, after kill(); resolves when the Node is Ready. */
  start(): Promise<void>;
  /** Stops kubelet (TERM, then KILL) and starts it again; resolves when the Node is Ready. */
  restartKubelet(): Promise<void>;
  /** Full teardown: every process of the node, its mounts, cgroups and network. Idempotent. */
  stop(): Promise<void>;
}

/**
 * argv that runs `argv` inside a node: its network namespace and its holder's mount namespace.
 * `tied` (a node-level daemon) adds a parent-death signal, so the process dies with this runtime
 * rather than outliving a lab whose `down` would miss it.
 */
export function inNode(n: { netns: string; holderPid: number }, argv: string[], tied = true): string[] {
  const enter = [
    "nsenter",
    `--net=/run/netns/${n.netns}`,
    `--mount=/proc/${n.holderPid}/ns/mnt`,
    "--",
    ...argv,
  ];
  return tied ? ["setpriv", "--pdeathsig", "KILL", "--", ...enter] : enter;
}

/** The values kubelet wants; bind-mounted inside the node so it finds them set and writes nothing to the host. */
const NODE_SYSCTLS: Record<string, string> = {
  "kernel/panic": "10",
  "kernel/panic_on_oops": "1",
  "vm/overcommit_memory": "1",
  "vm/panic_on_oom": "0",
  "kernel/keys/root_maxkeys": "1000000",
  "kernel/keys/root_maxbytes": "25000000",
};

interface NodeRecord {
  name: string;
  index: number;
  netns: string;
  cgroupRoot: string;
  /** "mnt:[inode]" of the node's mount namespace, to find its processes after a crash. */
  mntns?: string;
  netnsId?: string;
}

const nodesDir = (dir: string) => join(dir, "nodes");
const recordPath = (dir: string, name: string) => join(nodesDir(dir), name, "node.json");

/** The cgroup v1 (and v2) hierarchies mounted under /sys/fs/cgroup. */
function cgroupHierarchies(): string[] {
  return readFileSync("/proc/self/mountinfo", "utf8")
    .split("\n")
    .map((l) => l.split(" "))
    .filter((f) => f[4]?.startsWith("/sys/fs/cgroup/") && (f.includes("cgroup") || f.includes("cgroup2")))
    .map((f) => f[4]!);
}

function createCgroupRoot(root: string): void {
  for (const h of cgroupHierarchies()) {
    const d = join(h, root);
    mkdirSync(d, { recursive: true });
    if (existsSync(join(h, "cpuset.cpus"))) {
      for (const f of ["cpuset.cpus", "cpuset.mems"]) {
        if (readFileSync(join(d, f), "utf8").trim() === "")
          writeFileSync(join(d, f), readFileSync(join(h, f)));
      }
    }
  }
}

function cgroupDirsDeepestFirst(dir: string): string[] {
  let entries: Dirent[];
  try {
    entries = readdirSync(dir, { withFileTypes: true });
  } catch (err) {
    // Gone (never made, or a container's cgroup removed while this walk ran): nothing below it.
    if ((err as NodeJS.ErrnoException).code === "ENOENT") return [];
    throw err;
  }
  const out: string[] = [];
  for (const e of entries) {
    if (e.isDirectory()) out.push(...cgroupDirsDeepestFirst(join(dir, e.name)));
  }
  out.push(dir);
  return out;
}

function cgroupPids(root: string): number[] {
  const pids = new Set<number>();
  for (const h of cgroupHierarchies()) {
    for (const d of cgroupDirsDeepestFirst(join(h, root))) {
      try {
        for (const l of readFileSync(join(d, "cgroup.procs"), "utf8").split("\n")) if (l) pids.add(Number(l));
      } catch {}
    }
  }
  return [...pids];
}

function nsPids(mntns?: string, netnsId?: string): number[] {
  if (!mntns && !netnsId) return [];
  const out: number[] = [];
  for (const e of readdirSync("/proc")) {
    if (!/^\d+$/.test(e)) continue;
    try {
      if (
        (mntns && readlinkSync(`/proc/${e}/ns/mnt`) === mntns) ||
        (netnsId && readlinkSync(`/proc/${e}/ns/net`) === netnsId)
      ) {
        out.push(Number(e));
      }
    } catch {}
  }
  return out;
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/**
 * Kills every process of a recorded node (its mount and network namespace, its cgroups), removes
 * its cgroups and its network. Retries until nothing is left or the deadline passes; throws with
 * what remains then.
 */
async function teardownRecord(dir: string, rec: NodeRecord, timeoutMs = 30_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  const victims = () =>
    [...new Set([...nsPids(rec.mntns, rec.netnsId), ...cgroupPids(rec.cgroupRoot)])].filter(
      (p) => p !== process.pid,
    );
  for (let left = victims(); left.length > 0; left = victims()) {
    if (Date.now() > deadline)
      throw new Error(`node ${rec.name}: processes survive kill -9: ${left.join(" ")}`);
    for (const p of left) {
      try {
        process.kill(p, "SIGKILL");
      } catch {}
    }
    await Bun.sleep(50);
  }
  // The daemons' TCP connections close with FINs sent from the node's netns; deleting the netns
  // before the peer acknowledged them leaves the API server holding half-open watches, and its
  // graceful shutdown then waits for them. So wait (briefly) until no FIN is unacknowledged.
  const unacked = () =>
    existsSync(`/run/netns/${rec.netns}`) &&
    Bun.spawnSync([
      "nsenter",
      `--net=/run/netns/${rec.netns}`,
      "--",
      "ss",
      "-Htn",
      "state",
      "fin-wait-1",
      "state",
      "established",
    ])
      .stdout.toString()
      .trim() !== "";
  for (const until = Date.now() + 1_000; unacked() && Date.now() < until; ) await Bun.sleep(20);
  for (const h of cgroupHierarchies()) {
    for (const d of cgroupDirsDeepestFirst(join(h, rec.cgroupRoot))) {
      for (;;) {
        try {
          rmdirSync(d);
          break;
        } catch (err) {
          if ((err as NodeJS.ErrnoException).code === "ENOENT") break;
          if (Date.now() > deadline)
            throw new Error(`node ${rec.name}: cannot remove cgroup ${d}: ${String(err)}`);
          await Bun.sleep(50);
        }
      }
    }
  }
  removeNodeNetwork(dir, rec.name);
}

/**
 * Tears down every node recorded under <dir>/nodes and the lab network, whether or not the
 * process that started them is alive: what `lab down` calls. Idempotent.
 */
export async function teardownNodes(dir: string): Promise<void> {
  if (existsSync(nodesDir(dir))) {
    for (const name of readdirSync(nodesDir(dir))) {
      const p = recordPath(dir, name);
      if (!existsSync(p)) continue;
      await teardownRecord(dir, JSON.parse(readFileSync(p, "utf8")) as NodeRecord);
    }
  }
  teardownNetwork(dir);
}

function renderCertKubeconfig(
  server: string,
  caPath: string,
  cert: { certPath: string; keyPath: string },
  user: string,
): string {
  return JSON.stringify({
    apiVersion: "v1",
    kind: "Config",
    clusters: [{ name: "distort-lab", cluster: { server, "certificate-authority": caPath } }],
    users: [{ name: user, user: { "client-certificate": cert.certPath, "client-key": cert.keyPath } }],
    contexts: [{ name: "distort-lab", context: { cluster: "distort-lab", user } }],
    "current-context": "distort-lab",
  });
}

function containerdConfig(sandboxImage: string, cniBinDir: string): string {
  return `version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "/run/containerd/containerd.sock"

[ttrpc]
  address = ""

[debug]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "/var/lib/containerd/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = ${JSON.stringify(sandboxImage)}
  restrict_oom_score_adj = true
  disable_apparmor = true
  enable_selinux = false
  stream_server_address = "127.0.0.1"

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = ${JSON.stringify(cniBinDir)}
    conf_dir = "/var/lib/distort-lab/cni/net.d"
`;
}

/** One bridge network per node: cni0 as the Pods' gateway, host-local addresses from the Pod CIDR, hostPort via portmap. */
function cniConflist(podCidr: string): string {
  return JSON.stringify(
    {
      cniVersion: "0.4.0",
      name: "dlab",
      plugins: [
        {
          type: "bridge",
          bridge: "cni0",
          isGateway: true,
          ipMasq: false,
          hairpinMode: true,
          ipam: { type: "host-local", ranges: [[{ subnet: podCidr }]], routes: [{ dst: LAB_BLOCK }] },
        },
        { type: "portmap", capabilities: { portMappings: true } },
      ],
    },
    null,
    2,
  );
}

function kubeletConfig(ip: string, cgroupRoot: string, caPath: string): string {
  return JSON.stringify(
    {
      apiVersion: "kubelet.config.k8s.io/v1beta1",
      kind: "KubeletConfiguration",
      failCgroupV1: false,
      cgroupDriver: "cgroupfs",
      cgroupRoot,
      address: ip,
      port: 10250,
      readOnlyPort: 0,
      healthzBindAddress: "127.0.0.1",
      healthzPort: 10248,
      authentication: {
        anonymous: { enabled: false },
        webhook: { enabled: true },
        x509: { clientCAFile: caPath },
      },
      authorization: { mode: "Webhook" },
      containerRuntimeEndpoint: "unix:///run/containerd/containerd.sock",
      registerNode: true,
      rotateCertificates: false,
      serverTLSBootstrap: false,
      failSwapOn: false,
      protectKernelDefaults: false,
      evictionHard: {
        "memory.available": "1Mi",
        "nodefs.available": "1%",
        "nodefs.inodesFree": "1%",
        "imagefs.available": "1%",
      },
      imageGCHighThresholdPercent: 100,
      imageGCLowThresholdPercent: 99,
      serializeImagePulls: false,
      volumePluginDir: "/var/lib/kubelet/volume-plugins",
      containerLogMaxSize: "10Mi",
      nodeStatusUpdateFrequency: "10s",
      // kubelet asks CSI drivers for each volume's condition (NodeGetVolumeStats) and exports it
      // as kubelet_volume_stats_health_status_abnormal; measured every 10 s instead of every minute.
      featureGates: { CSIVolumeHealth: true },
      volumeStatsAggPeriod: "10s",
    },
    null,
    2,
  );
}

async function waitUntil(
  what: string,
  timeoutMs: number,
  probe: () => Promise<boolean> | boolean,
  failed?: () => string | undefined,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const why = failed?.();
    if (why) throw new Error(`${what}: ${why}`);
    if (await Promise.resolve(probe()).catch(() => false)) return;
    if (Date.now() > deadline) throw new Error(`${what}: not after ${timeoutMs} ms`);
    await Bun.sleep(100);
  }
}

function tail(path: string, lines = 20): string {
  try {
    return readFileSync(path, "utf8").split("\n").slice(-lines).join("\n");
  } catch {
    return "(no log)";
  }
}

/** True when the API server reports Node `name` with condition Ready=True. */
export async function nodeReady(cp: ControlPlane, name: string): Promise<boolean> {
  const r = await fetch(`${cp.server}/api/v1/nodes/${name}`, {
    headers: { authorization: `Bearer ${cp.token}` },
    tls: { ca: cp.caPem },
  });
  if (r.status !== 200) return false;
  const node = (await r.json()) as { status?: { conditions?: { type: string; status: string }[] } };
  return node.status?.conditions?.some((c) => c.type === "Ready" && c.status === "True") ?? false;
}

interface Shared {
  cp: ControlPlane;
  opts: StartNodesOptions;
  tools: NodeToolPaths;
  proxyCert: { certPath: string; keyPath: string };
}

async function startNode(shared: Shared, spec: NodeSpec, index: number): Promise<LabNode> {
  const { cp, opts, tools } = shared;
  const say = opts.progress ?? (() => {});
  if (!/^[a-z0-9]([a-z0-9-]{0,18}[a-z0-9])?$/.test(spec.name)) throw new Error(`bad node name: ${spec.name}`);
  if (!cp.cluster) throw new Error("startNodes needs a control plane started with the cluster profile");
  const root = join(nodesDir(opts.dir), spec.name);
  const paths = {
    root,
    varLib: join(root, "var-lib"),
    run: join(root, "run"),
    varLog: join(root, "var-log"),
    logs: join(root, "logs"),
    conf: join(root, "conf"),
  };
  for (const p of Object.values(paths)) mkdirSync(p, { recursive: true });
  const { ip, podCidr } = nodeAddressing(index);
  const netns = netnsName(spec.name);
  const cgroupRoot = `/${netns}`;
  const rec: NodeRecord = { name: spec.name, index, netns, cgroupRoot };
  writeFileSync(recordPath(opts.dir, spec.name), JSON.stringify(rec));
  const t0 = performance.now();
  const elapsed = () => `${Math.round(performance.now() - t0)} ms`;

  const procs: { containerd?: Subprocess; kubelet?: Subprocess; kubeProxy?: Subprocess } = {};
  let holder: Subprocess | undefined;
  let stopped = false;

  const stop = async () => {
    if (stopped) return;
    stopped = true;
    for (const p of [procs.kubelet, procs.kubeProxy, procs.containerd, holder]) {
      if (p && p.exitCode === null && p.signalCode === null) p.kill("SIGKILL");
    }
    await teardownRecord(opts.dir, rec);
    await Promise.all([procs.kubelet, procs.kubeProxy, procs.containerd, holder].map((p) => p?.exited));
    say(`node ${spec.name} torn down`);
  };

  try {
    addNodeNetwork(opts.dir, spec.name, index);
    rec.netnsId = `net:[${statSync(`/run/netns/${netns}`).ino}]`;
    createCgroupRoot(cgroupRoot);

    // Sysctl files and per-node config, all under the node's own directories.
    const sysctlDir = join(root, "sysctl");
    mkdirSync(sysctlDir, { recursive: true });
    const sysctlBinds: string[] = [];
    for (const [key, value] of Object.entries(NODE_SYSCTLS)) {
      if (!existsSync(`/proc/sys/${key}`)) continue;
      const f = join(sysctlDir, key.replaceAll("/", "."));
      writeFileSync(f, `${value}\n`);
      sysctlBinds.push(f, `/proc/sys/${key}`);
    }
    const cniConfDir = join(paths.varLib, "distort-lab", "cni", "net.d");
    mkdirSync(cniConfDir, { recursive: true });
    writeFileSync(join(cniConfDir, "10-dlab.conflist"), cniConflist(podCidr));
    writeFileSync(join(paths.conf, "containerd.toml"), containerdConfig(opts.sandboxImage, tools.cniBinDir));
    writeFileSync(join(paths.conf, "kubelet.json"), kubeletConfig(ip, cgroupRoot, cp.caCertPath));
    const nodeCert = await signClientCertificate(
      cp,
      paths.conf,
      "kubelet-client",
      `system:node:${spec.name}`,
      ["system:nodes"],
    );
    writeFileSync(
      join(paths.conf, "kubelet.kubeconfig"),
      renderCertKubeconfig(cp.server, cp.caCertPath, nodeCert, `system:node:${spec.name}`),
    );
    writeFileSync(
      join(paths.conf, "kube-proxy.kubeconfig"),
      renderCertKubeconfig(cp.server, cp.caCertPath, shared.proxyCert, "system:kube-proxy"),
    );

    // The holder: a new mount namespace (slave of the host's), the bind mounts, then sleep.
    const script = [
      "set -e",
      'r="$1"; shift',
      'mount --bind "$r/run" /run',
      'mount --bind "$r/var-lib" /var/lib',
      // Shared within the node: Bidirectional hostPath mounts below /var/lib (the DPU plugin's
      // state directory) need it; kubelet makes only its own root directory shared.
      "mount --make-shared /var/lib",
      'mount --bind "$r/var-log" /var/log',
      'while [ $# -gt 0 ]; do mount --bind "$1" "$2"; shift 2; done',
      "echo ready",
      "exec sleep 2147483647",
    ].join("\n");
    const holderLog = openSync(join(paths.logs, "holder.log"), "a");
    const h = Bun.spawn(
      [
        "setpriv",
        "--pdeathsig",
        "KILL",
        "--",
        "unshare",
        "-m",
        "--propagation",
        "slave",
        "--",
        "sh",
        "-c",
        script,
        "holder",
        root,
        ...sysctlBinds,
      ],
      { stdout: "pipe", stderr: holderLog, stdin: "ignore" },
    );
    holder = h;
    closeSync(holderLog);
    const reader = h.stdout.getReader();
    const sawReady = (async () => {
      let out = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) return false;
        out += new TextDecoder().decode(value);
        if (out.includes("ready")) return true;
      }
    })();
    const ready = await Promise.race([sawReady, Bun.sleep(30_000).then(() => false)]);
    try {
      reader.releaseLock();
    } catch {}
    if (!ready) {
      const why = h.exitCode !== null ? `exited ${h.exitCode}` : "not ready after 30 s";
      throw new Error(`node ${spec.name}: mount holder ${why}: ${tail(join(paths.logs, "holder.log"))}`);
    }
    rec.mntns = readlinkSync(`/proc/${h.pid}/ns/mnt`);
    writeFileSync(recordPath(opts.dir, spec.name), JSON.stringify(rec));
    // Daemons start only once the node's /run is its own: containerd's fixed paths must not land on the host.
    const mounted = readFileSync(`/proc/${h.pid}/mountinfo`, "utf8")
      .split("\n")
      .some((l) => l.split(" ")[4] === "/var/log");
    if (!mounted) throw new Error(`node ${spec.name}: holder reports ready but /var/log is not mounted`);

    const spawnDaemon = (logName: string, argv: string[]): Subprocess => {
      const fd = openSync(join(paths.logs, `${logName}.log`), "a");
      const p = Bun.spawn(inNode({ netns, holderPid: h.pid }, argv), {
        cwd: "/",
        stdout: fd,
        stderr: fd,
        stdin: "ignore",
      });
      closeSync(fd);
      return p;
    };
    const running = (p?: Subprocess) => p !== undefined && p.exitCode === null && p.signalCode === null;
    const died = (what: string, p: Subprocess, log: string) => () =>
      running(p)
        ? undefined
        : `${what} exited (${p.exitCode ?? p.signalCode}):\n${tail(join(paths.logs, log))}`;
    const containerdSocket = join(paths.run, "containerd", "containerd.sock");

    const startContainerd = async () => {
      const p = spawnDaemon("containerd", [
        tools.containerd,
        "--config",
        join(paths.conf, "containerd.toml"),
      ]);
      procs.containerd = p;
      await waitUntil(
        `node ${spec.name}: containerd`,
        60_000,
        () =>
          existsSync(containerdSocket) &&
          Bun.spawnSync(["ctr", "--address", containerdSocket, "version"]).exitCode === 0,
        died("containerd", p, "containerd.log"),
      );
    };
    const startKubelet = async () => {
      const labels = Object.entries(spec.labels ?? {}).map(([k, v]) => `${k}=${v}`);
      const p = spawnDaemon("kubelet", [
        tools.kubelet,
        `--config=${join(paths.conf, "kubelet.json")}`,
        `--kubeconfig=${join(paths.conf, "kubelet.kubeconfig")}`,
        `--hostname-override=${spec.name}`,
        `--node-ip=${ip}`,
        ...(labels.length ? [`--node-labels=${labels.join(",")}`] : []),
        "--v=1",
      ]);
      procs.kubelet = p;
      await waitUntil(
        `node ${spec.name}: Node Ready`,
        opts.readyTimeoutMs ?? 180_000,
        () => nodeReady(cp, spec.name),
        died("kubelet", p, "kubelet.log"),
      );
    };
    const startKubeProxy = () => {
      procs.kubeProxy = spawnDaemon("kube-proxy", [
        tools.kubeProxy,
        `--kubeconfig=${join(paths.conf, "kube-proxy.kubeconfig")}`,
        "--proxy-mode=iptables",
        `--hostname-override=${spec.name}`,
        "--conntrack-max-per-core=0",
        "--conntrack-tcp-timeout-established=0",
        "--conntrack-tcp-timeout-close-wait=0",
        `--metrics-bind-address=127.0.0.1:10249`,
        `--healthz-bind-address=127.0.0.1:10256`,
        "--v=1",
      ]);
    };
    const kill9 = async (p?: Subprocess) => {
      if (!running(p)) return;
      p!.kill("SIGKILL");
      await p!.exited;
    };

    await startContainerd();
    say(`node ${spec.name}: containerd ready (${elapsed()})`);
    for (const archive of opts.images ?? []) await importImage({ containerdSocket }, archive);
    await startKubelet();
    startKubeProxy();
    say(`node ${spec.name}: Ready at ${ip} (${elapsed()})`);

    const node: LabNode = {
      name: spec.name,
      index,
      ip,
      podCidr,
      netns,
      holderPid: h.pid,
      paths,
      containerdSocket,
      cgroupRoot,
      async exec(argv, eopts) {
        const p = Bun.spawn(inNode({ netns, holderPid: h.pid }, argv, false), {
          cwd: "/",
          stdin: eopts?.stdin !== undefined ? Buffer.from(eopts.stdin) : "ignore",
          stdout: "pipe",
          stderr: "pipe",
        });
        const [exitCode, stdout, stderr] = await Promise.all([
          p.exited,
          new Response(p.stdout).text(),
          new Response(p.stderr).text(),
        ]);
        return { exitCode, stdout, stderr };
      },
      pids() {
        const out: NodePids = { holder: h.pid };
        if (running(procs.containerd)) out.containerd = procs.containerd!.pid;
        if (running(procs.kubelet)) out.kubelet = procs.kubelet!.pid;
        if (running(procs.kubeProxy)) out.kubeProxy = procs.kubeProxy!.pid;
        return out;
      },
      async kill() {
        await Promise.all([kill9(procs.kubelet), kill9(procs.containerd)]);
      },
      async start() {
        if (stopped) throw new Error(`node ${spec.name} was stopped; start a new one`);
        if (!running(procs.containerd)) await startContainerd();
        // containerd answers `ctr version` before its CRI server has loaded the containers it had
        // (many, on a storage node killed with its Pods): a kubelet started meanwhile exits with
        // "server is not initialized yet", so it is started again, a bounded number of times.
        for (let attempt = 1; !running(procs.kubelet); attempt++) {
          try {
            await startKubelet();
          } catch (err) {
            if (attempt >= 10 || !String((err as Error).message).includes("server is not initialized yet"))
              throw err;
            await Bun.sleep(2000);
          }
        }
        if (!running(procs.kubeProxy)) startKubeProxy();
      },
      async restartKubelet() {
        const p = procs.kubelet;
        if (running(p)) {
          p!.kill("SIGTERM");
          const done = await Promise.race([p!.exited.then(() => true), Bun.sleep(10_000).then(() => false)]);
          if (!done) await kill9(p);
        }
        await startKubelet();
      },
      stop,
    };
    return node;
  } catch (err) {
    await stop().catch(() => {});
    throw err;
  }
}

/**
 * Starts one node per spec, all at once, and resolves when every Node is Ready (kube-proxy
 * started too). The control plane must have been started with the cluster profile and must run
 * kube-controller-manager and kube-scheduler for Pods to be placed. On any failure every node
 * started here is torn down before the error propagates. The caller owns stop() of each handle
 * (or teardownNodes(dir) for all, also from another process).
 */
export async function startNodes(
  cp: ControlPlane,
  specs: NodeSpec[],
  opts: StartNodesOptions,
): Promise<LabNode[]> {
  for (const bad of ["/run/", "/var/lib/", "/var/log/"]) {
    if (`${opts.dir}/`.startsWith(bad))
      throw new Error(`lab directory ${opts.dir} is under ${bad}, which nodes overmount`);
  }
  const tools = opts.tools ?? nodeToolPaths();
  for (const [what, p] of Object.entries(tools)) {
    if (!existsSync(p)) throw new Error(`${what} missing at ${p}`);
  }
  mkdirSync(nodesDir(opts.dir), { recursive: true });
  const proxyCert = await signClientCertificate(cp, nodesDir(opts.dir), "kube-proxy", "system:kube-proxy");
  const shared: Shared = { cp, opts, tools, proxyCert };
  const results = await Promise.allSettled(specs.map((s, i) => startNode(shared, s, s.index ?? i + 1)));
  const failed = results.find((r) => r.status === "rejected");
  if (failed) {
    await Promise.all(results.map((r) => (r.status === "fulfilled" ? r.value.stop() : undefined)));
    throw (failed as PromiseRejectedResult).reason;
  }
  return results.map((r) => (r as PromiseFulfilledResult<LabNode>).value);
}

/** Sum of resident memory (kB) of the given pids and all their descendants that are still alive. */
export function rssKb(pids: number[]): number {
  let total = 0;
  for (const pid of pids) {
    try {
      const m = /VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${pid}/status`, "utf8"));
      if (m) total += Number(m[1]);
    } catch {}
  }
  return total;
}

/** Pids in a node's cgroup root (its Pods' containers and sandboxes), in any hierarchy. */
export function nodeProcessesByCgroup(cgroupRoot: string): number[] {
  return cgroupPids(cgroupRoot).filter(alive);
}

/** Every pid belonging to a node: in its mount or network namespace or its cgroup root. */
export function nodeProcesses(node: LabNode): number[] {
  const mnt = readlinkSync(`/proc/${node.holderPid}/ns/mnt`);
  const net = `net:[${statSync(`/run/netns/${node.netns}`).ino}]`;
  return [...new Set([...nsPids(mnt, net), ...cgroupPids(node.cgroupRoot)])].filter(alive);
}
