// Three real kubelet nodes on a cluster-profile control plane: all Ready, a busybox DaemonSet on
// each, Pod-to-Pod across nodes and Pod-to-API-server through the kubernetes Service, kubectl logs
// and exec, a node's kill -9 seen as NotReady and its restart as Ready with its Pod kept, and after
// stop the host exactly as before (processes, mounts, netns, links, routes, iptables, cgroups, sysctls).
// busybox wget runs under `timeout`: its own -T option crashes Debian's busybox-static 1.35.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type ControlPlane, startControlPlane } from "./control-plane.ts";
import {
  diffFootprints,
  type HostFootprint,
  isLabProcess,
  type ProcessInfo,
  snapshotHost,
} from "./host-footprint.ts";
import {
  BRIDGE_ADDRESS,
  ensureBridge,
  KUBERNETES_SERVICE_IP,
  SERVICE_CIDR,
  teardownNetwork,
} from "./node-network.ts";
import {
  type LabNode,
  nodeProcesses,
  nodeProcessesByCgroup,
  rssKb,
  startNodes,
  teardownNodes,
} from "./nodes.ts";
import { busyboxImageSpec, pauseImageSpec, writeOciArchive } from "./oci-image.ts";
import { eventually } from "./test-support.ts";
import { toolPaths } from "./tools.ts";

const dir = mkdtempSync(join(tmpdir(), "distort-nodes-"));
const labNs = new Set<string>();
/** Processes of this lab only: the machine is shared, other engineers' control planes come and go. */
const ours = (p: ProcessInfo) =>
  isLabProcess(p) &&
  (p.cmdline.includes(dir) || /:\/dlab-/m.test(p.cgroup) || labNs.has(p.mntns) || labNs.has(p.netns));
/**
 * The machine is shared: other engineers' image builds (podman CNI, distort-images-* cgroups) and
 * labs (loop devices and mounts under their own /tmp/distort-* directories) come and go meanwhile,
 * and so do the machine's own per-command cgroups (process_api/<id>).
 * None of that is this lab's doing; everything of this lab is named dlab*, lives in `dir` or
 * carries no such marker.
 */
const foreign = (line: string) =>
  /podman|\/process_api\//.test(line) || (/distort-|\/tmp\//.test(line) && !line.includes(dir));

let before: HostFootprint;
let cp: ControlPlane | undefined;
let nodes: LabNode[] = [];
let torn = false;
const say = (l: string) => console.log(`[nodes.int] ${l}`);

function kubectl(args: string[], stdin?: string): { code: number; out: string; err: string } {
  const p = Bun.spawnSync(
    [
      toolPaths().kubectl,
      "--kubeconfig",
      cp!.kubeconfigPath,
      "--cache-dir",
      join(dir, "kubectl-cache"),
      ...args,
    ],
    {
      stdin: stdin === undefined ? "ignore" : Buffer.from(stdin),
    },
  );
  return { code: p.exitCode, out: p.stdout.toString(), err: p.stderr.toString() };
}

function kubectlOk(args: string[], stdin?: string): string {
  const r = kubectl(args, stdin);
  if (r.code !== 0) throw new Error(`kubectl ${args.join(" ")}: ${r.err || r.out}`);
  return r.out;
}

interface PodView {
  name: string;
  uid: string;
  node: string;
  ip: string;
  phase: string;
  restarts: number;
}

function dsPods(): PodView[] {
  const list = JSON.parse(kubectlOk(["get", "pods", "-n", "default", "-l", "app=probe", "-o", "json"])) as {
    items: {
      metadata: { name: string; uid: string };
      spec: { nodeName?: string };
      status: {
        phase?: string;
        podIP?: string;
        containerStatuses?: { restartCount: number; ready: boolean }[];
      };
    }[];
  };
  return list.items.map((p) => ({
    name: p.metadata.name,
    uid: p.metadata.uid,
    node: p.spec.nodeName ?? "",
    ip: p.status.podIP ?? "",
    phase: p.status.containerStatuses?.every((c) => c.ready) ? (p.status.phase ?? "") : "NotReady",
    restarts: p.status.containerStatuses?.reduce((n, c) => n + c.restartCount, 0) ?? 0,
  }));
}

function nodeReadyStatus(name: string): string {
  const n = JSON.parse(kubectlOk(["get", "node", name, "-o", "json"])) as {
    status: { conditions: { type: string; status: string }[] };
  };
  return n.status.conditions.find((c) => c.type === "Ready")?.status ?? "";
}

async function teardown(): Promise<void> {
  if (torn) return;
  torn = true;
  for (const n of nodes) await n.stop();
  await cp?.stop();
  await teardownNodes(dir);
  teardownNetwork(dir);
}

beforeAll(async () => {
  before = snapshotHost({ processFilter: ours });
  const t0 = performance.now();
  const pause = writeOciArchive(pauseImageSpec("distort.lab/pause:nodes-int"));
  const busybox = writeOciArchive(busyboxImageSpec("distort.lab/workload:nodes-int"));
  ensureBridge(dir);
  try {
    cp = await startControlPlane({
      dir: join(dir, "cp"),
      controllerManager: true,
      scheduler: true,
      cluster: { address: BRIDGE_ADDRESS, serviceCidr: SERVICE_CIDR },
      progress: say,
    });
    const t1 = performance.now();
    nodes = await startNodes(
      cp,
      [1, 2, 3].map((i) => ({ name: `n${i}`, labels: { "topology.storage.distort.io/fabric": "lab" } })),
      { dir, sandboxImage: pause.ref, images: [pause.path, busybox.path], progress: say },
    );
    for (const n of nodes) {
      labNs.add(
        `net:[${Bun.spawnSync(["stat", "-L", "-c", "%i", `/run/netns/${n.netns}`])
          .stdout.toString()
          .trim()}]`,
      );
      labNs.add(
        Bun.spawnSync(["readlink", `/proc/${n.holderPid}/ns/mnt`])
          .stdout.toString()
          .trim(),
      );
    }
    say(`control plane ${Math.round(t1 - t0)} ms, 3 nodes Ready ${Math.round(performance.now() - t1)} ms`);
  } catch (err) {
    await teardown();
    throw err;
  }
}, 600_000);

afterAll(async () => {
  await teardown();
  rmSync(dir, { recursive: true, force: true });
}, 120_000);

test("three nodes Ready at their IPs; the host got no iptables rule and no sysctl change", () => {
  const list = JSON.parse(kubectlOk(["get", "nodes", "-o", "json"])) as {
    items: {
      metadata: { name: string; labels: Record<string, string> };
      status: { addresses: { type: string; address: string }[] };
    }[];
  };
  const byName = new Map(list.items.map((n) => [n.metadata.name, n]));
  for (const n of nodes) {
    expect(nodeReadyStatus(n.name)).toBe("True");
    const obj = byName.get(n.name)!;
    expect(obj.status.addresses).toContainEqual({ type: "InternalIP", address: n.ip });
    expect(obj.metadata.labels["topology.storage.distort.io/fabric"]).toBe("lab");
  }
  const now = snapshotHost({ processFilter: ours });
  const changed = diffFootprints(before, now).filter(
    (l) => !foreign(l) && (l.includes(" iptables: ") || l.startsWith("~ sysctl")),
  );
  expect(changed).toEqual([]);
  for (const n of nodes) {
    const rss = rssKb(nodeProcesses(n));
    say(`node ${n.name}: ${nodeProcesses(n).length} processes, ${Math.round(rss / 1024)} MB RSS`);
    expect(rss).toBeGreaterThan(0);
  }
});

test("a busybox DaemonSet runs on every node; Pods reach Pods on other nodes and the API server by its Service", async () => {
  const ds = {
    apiVersion: "apps/v1",
    kind: "DaemonSet",
    metadata: { name: "probe", namespace: "default" },
    spec: {
      selector: { matchLabels: { app: "probe" } },
      template: {
        metadata: { labels: { app: "probe" } },
        spec: {
          terminationGracePeriodSeconds: 1,
          containers: [
            {
              name: "probe",
              image: "distort.lab/workload:nodes-int",
              imagePullPolicy: "Never",
              command: [
                "/bin/sh",
                "-c",
                'mkdir -p /www && hostname > /www/index.html && echo "probe started on $(hostname)" && exec httpd -f -p 8080 -h /www',
              ],
            },
          ],
        },
      },
    },
  };
  kubectlOk(["apply", "-f", "-"], JSON.stringify(ds));
  const pods = await eventually(
    () => {
      const ps = dsPods();
      return ps.length === 3 && ps.every((p) => p.phase === "Running" && p.ip) ? ps : undefined;
    },
    120_000,
    "3 probe Pods Running",
  );
  expect(new Set(pods.map((p) => p.node))).toEqual(new Set(["n1", "n2", "n3"]));
  for (const p of pods) expect(p.ip.startsWith(`198.19.${p.node.slice(1)}.`)).toBe(true);
  const on = (node: string) => pods.find((p) => p.node === node)!;

  const cross = kubectlOk([
    "exec",
    on("n2").name,
    "--",
    "timeout",
    "10",
    "wget",
    "-qO-",
    `http://${on("n3").ip}:8080/`,
  ]);
  expect(cross.trim()).toBe(on("n3").name);

  // busybox's TLS shares no cipher suite with kube-apiserver (handshake alert 40), so the Pod
  // speaks plain HTTP to the Service's port 443: Go's TLS server answers that with its own 400.
  const api = kubectlOk([
    "exec",
    on("n2").name,
    "--",
    "sh",
    "-c",
    `printf 'GET /readyz HTTP/1.0\\r\\n\\r\\n' | timeout 10 nc ${KUBERNETES_SERVICE_IP} 443`,
  ]);
  expect(api).toMatch(/^HTTP\/1\.[01] 400 Bad Request/);
  expect(api).toContain("Client sent an HTTP request to an HTTPS server");

  const env = kubectlOk(["exec", on("n1").name, "--", "sh", "-c", "echo $KUBERNETES_SERVICE_HOST"]);
  expect(env.trim()).toBe(KUBERNETES_SERVICE_IP);

  await eventually(
    () => kubectl(["logs", on("n3").name]).out.includes(`probe started on ${on("n3").name}`),
    30_000,
    "kubectl logs shows the start line",
  );

  // ServiceAccount admission, the token controller and the root CA publisher: every Pod gets a
  // token and the lab CA.
  const sa = "/var/run/secrets/kubernetes.io/serviceaccount";
  expect(kubectlOk(["exec", on("n1").name, "--", "cat", `${sa}/namespace`])).toBe("default");
  expect(kubectlOk(["exec", on("n1").name, "--", "cat", `${sa}/ca.crt`])).toBe(cp!.caPem);
  expect(kubectlOk(["exec", on("n1").name, "--", "cat", `${sa}/token`])).toMatch(
    /^ey[\w-]+\.[\w-]+\.[\w-]+$/,
  );
}, 180_000);

test("a privileged hostNetwork Pod serves on its node's IP and reaches the API server's Service", async () => {
  const pod = {
    apiVersion: "v1",
    kind: "Pod",
    metadata: { name: "hostnet", namespace: "default" },
    spec: {
      nodeName: "n1",
      hostNetwork: true,
      terminationGracePeriodSeconds: 1,
      containers: [
        {
          name: "hostnet",
          image: "distort.lab/workload:nodes-int",
          imagePullPolicy: "Never",
          securityContext: { privileged: true },
          command: [
            "/bin/sh",
            "-c",
            "mkdir -p /www && echo hostnet > /www/index.html && exec httpd -f -p 8081 -h /www",
          ],
        },
      ],
    },
  };
  kubectlOk(["apply", "-f", "-"], JSON.stringify(pod));
  await eventually(
    () =>
      JSON.parse(kubectlOk(["get", "pod", "hostnet", "-n", "default", "-o", "json"])).status?.phase ===
      "Running",
    60_000,
    "hostnet Running",
  );
  const n1 = nodes[0]!;
  const from = dsPods().find((p) => p.node === "n2")!;
  const got = await eventually(
    () => {
      const r = kubectl(["exec", from.name, "--", "timeout", "10", "wget", "-qO-", `http://${n1.ip}:8081/`]);
      return r.code === 0 ? r.out.trim() : undefined;
    },
    30_000,
    "hostnet answers on n1's IP",
  );
  expect(got).toBe("hostnet");
  const api = kubectlOk([
    "exec",
    "hostnet",
    "--",
    "sh",
    "-c",
    `printf 'GET / HTTP/1.0\\r\\n\\r\\n' | timeout 10 nc ${KUBERNETES_SERVICE_IP} 443`,
  ]);
  expect(api).toContain("Client sent an HTTP request to an HTTPS server");
  // Privileged: the container sees the node's devices.
  expect(kubectlOk(["exec", "hostnet", "--", "ls", "/dev"])).toContain("loop-control");
}, 120_000);

test("a Deployment's replicas become available", async () => {
  const deploy = {
    apiVersion: "apps/v1",
    kind: "Deployment",
    metadata: { name: "sleeper", namespace: "default" },
    spec: {
      replicas: 2,
      selector: { matchLabels: { app: "sleeper" } },
      template: {
        metadata: { labels: { app: "sleeper" } },
        spec: {
          terminationGracePeriodSeconds: 1,
          containers: [
            {
              name: "sleeper",
              image: "distort.lab/workload:nodes-int",
              imagePullPolicy: "Never",
              args: ["sleep", "3600"],
            },
          ],
        },
      },
    },
  };
  kubectlOk(["apply", "-f", "-"], JSON.stringify(deploy));
  await eventually(
    () => {
      const d = JSON.parse(kubectlOk(["get", "deployment", "sleeper", "-n", "default", "-o", "json"])) as {
        status?: { availableReplicas?: number };
      };
      return d.status?.availableReplicas === 2;
    },
    120_000,
    "2 sleeper replicas available",
  );
}, 150_000);

test("kill -9 of a node's kubelet and containerd: NotReady, then Ready again after start with its Pod kept", async () => {
  const n3 = nodes[2]!;
  const pod = dsPods().find((p) => p.node === "n3")!;
  const killed = n3.pids();
  await n3.kill();
  expect(n3.pids().kubelet).toBeUndefined();
  expect(n3.pids().containerd).toBeUndefined();
  expect([killed.kubelet, killed.containerd].every((p) => p !== undefined)).toBe(true);
  const t0 = performance.now();
  // node-monitor-grace-period is 20 s; a minute covers a loaded machine.
  await eventually(() => nodeReadyStatus("n3") !== "True", 90_000, "n3 NotReady");
  say(`n3 NotReady ${Math.round(performance.now() - t0)} ms after kill -9`);
  // The Pod kept running without kubelet and containerd: its shim and httpd answer.
  const other = dsPods().find((p) => p.node === "n1")!;
  expect(
    kubectlOk(["exec", other.name, "--", "timeout", "10", "wget", "-qO-", `http://${pod.ip}:8080/`]).trim(),
  ).toBe(pod.name);
  const t1 = performance.now();
  await n3.start();
  say(`n3 Ready ${Math.round(performance.now() - t1)} ms after start`);
  expect(nodeReadyStatus("n3")).toBe("True");
  const after = await eventually(
    () => dsPods().find((p) => p.node === "n3" && p.phase === "Running"),
    60_000,
    "n3's Pod Running after restart",
  );
  expect(after.uid).toBe(pod.uid);
  expect(after.restarts).toBe(pod.restarts);
  // The restarted kubelet serves exec once it has synced the Pod again.
  const served = await eventually(
    () => {
      const r = kubectl(["exec", pod.name, "--", "cat", "/www/index.html"]);
      return r.code === 0 ? r.out.trim() : undefined;
    },
    60_000,
    "exec into n3's Pod after restart",
  );
  expect(served).toBe(pod.name);
  const kept = dsPods().find((p) => p.node === "n3")!;
  expect(kept.uid).toBe(pod.uid);
  expect(kept.restarts).toBe(pod.restarts);
}, 240_000);

test("restartKubelet keeps Pods; pause exits on TERM; after a crash teardownNodes and stop leave the host as it was", async () => {
  const n1 = nodes[0]!;
  const pod = dsPods().find((p) => p.node === "n1")!;
  const oldKubelet = n1.pids().kubelet;
  await n1.restartKubelet();
  expect(n1.pids().kubelet).not.toBe(oldKubelet);
  const again = await eventually(
    () => dsPods().find((p) => p.node === "n1" && p.phase === "Running"),
    60_000,
    "n1 Pod",
  );
  expect(again.uid).toBe(pod.uid);
  expect(again.restarts).toBe(pod.restarts);

  for (const n of nodes) {
    const procs = nodeProcesses(n);
    say(`node ${n.name} with its Pods: ${procs.length} processes, ${Math.round(rssKb(procs) / 1024)} MB RSS`);
  }

  // The sandbox (pause) process exits on SIGTERM, though it is PID 1 of its namespace.
  const n2 = nodes[1]!;
  const pause = nodeProcesses(n2).find((pid) =>
    readFileSync(`/proc/${pid}/cmdline`, "utf8").includes("trap 'exit 0' TERM INT"),
  );
  expect(pause).toBeDefined();
  process.kill(pause!, "SIGTERM");
  await eventually(() => !existsSync(`/proc/${pause}`), 10_000, "pause process gone after SIGTERM");

  // A crashed lab: n2's holder and daemons die without any cleanup; its shims and containers
  // live on. teardownNodes(dir), as `lab down` calls it from another process, removes them all.
  const { holder, containerd, kubelet, kubeProxy } = n2.pids();
  for (const pid of [holder, containerd, kubelet, kubeProxy]) if (pid) process.kill(pid, "SIGKILL");
  const orphans = await eventually(
    () => {
      const left = nodeProcessesByCgroup(n2.cgroupRoot);
      return left.length > 0 && !left.includes(holder) ? left : undefined;
    },
    10_000,
    "n2's containers outliving its daemons",
  );
  expect(orphans.length).toBeGreaterThan(0);
  const t0 = performance.now();
  await teardownNodes(dir);
  say(`teardownNodes ${Math.round(performance.now() - t0)} ms`);
  expect(nodeProcessesByCgroup(n2.cgroupRoot)).toEqual([]);
  await teardown();
  say(`teardown ${Math.round(performance.now() - t0)} ms`);
  const after = snapshotHost({ processFilter: ours });
  expect(diffFootprints(before, after).filter((l) => !foreign(l))).toEqual([]);
}, 180_000);
