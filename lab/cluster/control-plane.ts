// Runs a real Kubernetes control plane: etcd, kube-apiserver and optionally kube-controller-manager
// and kube-scheduler, with generated certificates, a static admin token and a kubeconfig. On
// 127.0.0.1 by default; the cluster profile serves real kubelets on a lab bridge address. Every
// process is tied to its parent (parent-death signal) and stop() leaves no process or port.
import { generateKeyPairSync, randomBytes } from "node:crypto";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Subprocess } from "bun";
import { ensureTools, type ToolPaths } from "./tools.ts";

export interface ControlPlaneOptions {
  /** State directory; a fresh temporary one (removed on stop) when omitted. */
  dir?: string;
  /** Also run kube-controller-manager (PV binder, attach-detach, GC, namespace controllers). */
  controllerManager?: boolean;
  /**
   * Extra kube-controller-manager flags, e.g. its client rate (`--kube-api-qps`, default 20, and
   * `--kube-api-burst`, default 30), which a cluster sized for volume bursts raises.
   */
  controllerManagerArgs?: readonly string[];
  /** Also run kube-scheduler (it picks Pods' nodes and WaitForFirstConsumer volumes' selected node). */
  scheduler?: boolean;
  /** Progress lines for a person watching; silent by default. */
  progress?: (line: string) => void;
  tools?: ToolPaths;
  /** Passed to kube-apiserver; short values make watches end often, which tests use. */
  minRequestTimeoutSeconds?: number;
  /** Serve real kubelets: see ClusterProfile. Absent, the API server is a loopback-only store. */
  cluster?: ClusterProfile;
}

/**
 * The profile for a cluster with real nodes. kube-apiserver binds and advertises on `address`
 * (which must already be assigned on the host, e.g. the lab bridge), authenticates client
 * certificates signed by the lab CA, authorizes with Node,RBAC, admits ServiceAccounts and
 * NodeRestriction, and reaches kubelets with its own client certificate. kube-controller-manager
 * (when asked) also runs the ServiceAccount, token, root-CA publisher, node lifecycle and workload
 * controllers.
 */
export interface ClusterProfile {
  address: string;
  /** The Service range, e.g. "198.19.255.0/24"; its first address is the kubernetes Service. */
  serviceCidr: string;
  /** kube-controller-manager's --node-monitor-grace-period in seconds (default 20; upstream 50). */
  nodeMonitorGracePeriodSeconds?: number;
}

export interface ControlPlane {
  dir: string;
  server: string;
  token: string;
  caPem: string;
  kubeconfigPath: string;
  ports: { etcd: number; etcdPeer: number; apiserver: number };
  /** The lab CA (PEM files in dir): it signs the serving certificate and every client certificate. */
  caCertPath: string;
  caKeyPath: string;
  /** The cluster profile this control plane was started with, if any. */
  cluster?: ClusterProfile;
  pids(): number[];
  /** Terminates every process (TERM, then KILL after a grace period) and frees every port. Idempotent. */
  stop(): Promise<void>;
}

/**
 * Controllers a cluster with real nodes adds to KCM_CONTROLLERS: ServiceAccounts and their
 * tokens, the kube-root-ca.crt ConfigMap, node lifecycle (NotReady, taints), the workloads the
 * chart installs, EndpointSlices for Services, and Pod GC.
 */
export const KCM_CLUSTER_CONTROLLERS = [
  "serviceaccount-controller",
  "serviceaccount-token-controller",
  "root-ca-certificate-publisher-controller",
  "node-lifecycle-controller",
  "taint-eviction-controller",
  "daemonset-controller",
  "deployment-controller",
  "replicaset-controller",
  "statefulset-controller",
  "endpoints-controller",
  "endpointslice-controller",
  "pod-garbage-collector-controller",
];

/** Controllers worth running for storage flows; names as kube-controller-manager 1.36 spells them. */
export const KCM_CONTROLLERS = [
  "persistentvolume-binder-controller",
  "persistentvolume-attach-detach-controller",
  "persistentvolume-expander-controller",
  "persistentvolumeclaim-protection-controller",
  "persistentvolume-protection-controller",
  "garbage-collector-controller",
  "namespace-controller",
];

/** A port the kernel just handed out on `hostname`; the listener is closed before returning. */
export async function freePort(hostname = "127.0.0.1"): Promise<number> {
  const sock = Bun.listen({ hostname, port: 0, socket: { data() {} } });
  const port = sock.port;
  sock.stop(true);
  return port;
}

/** True when nothing listens on 127.0.0.1:port. */
export async function portIsFree(port: number): Promise<boolean> {
  try {
    const sock = Bun.listen({ hostname: "127.0.0.1", port, socket: { data() {} } });
    sock.stop(true);
    return true;
  } catch {
    return false;
  }
}

function kcmControllers(opts: ControlPlaneOptions): string[] {
  if (opts.cluster) return [...KCM_CONTROLLERS, ...KCM_CLUSTER_CONTROLLERS];
  // With a scheduler, Nodes need their not-ready taint lifted once their kubelet reports Ready.
  return [...KCM_CONTROLLERS, ...(opts.scheduler ? ["node-lifecycle-controller"] : [])];
}

async function run(cmd: string[], cwd: string): Promise<void> {
  const p = Bun.spawn(cmd, { cwd, stdout: "pipe", stderr: "pipe" });
  const code = await p.exited;
  if (code !== 0) throw new Error(`${cmd[0]} failed (${code}): ${await new Response(p.stderr).text()}`);
}

/** The first usable address of an IPv4 CIDR: the kubernetes Service's ClusterIP. */
export function firstServiceIp(cidr: string): string {
  const [base] = cidr.split("/");
  const parts = (base ?? "").split(".").map(Number);
  if (parts.length !== 4 || parts.some((n) => !Number.isInteger(n) || n < 0 || n > 255)) {
    throw new Error(`not an IPv4 CIDR: ${cidr}`);
  }
  const n = ((parts[0]! << 24) | (parts[1]! << 16) | (parts[2]! << 8) | parts[3]!) + 1;
  return [n >>> 24, (n >>> 16) & 255, (n >>> 8) & 255, n & 255].join(".");
}

/**
 * Signs a client certificate with the lab CA: CN is the user name, each of `groups` an O (what
 * kube-apiserver's x509 authenticator reads). Writes <name>.key and <name>.crt into `outDir`.
 */
export async function signClientCertificate(
  ca: { caCertPath: string; caKeyPath: string },
  outDir: string,
  name: string,
  user: string,
  groups: string[] = [],
): Promise<{ certPath: string; keyPath: string }> {
  const keyPath = join(outDir, `${name}.key`);
  const certPath = join(outDir, `${name}.crt`);
  const subj = `/${[...groups.map((g) => `O=${g}`), `CN=${user}`].join("/")}`;
  const ext = join(outDir, `${name}.ext`);
  writeFileSync(ext, "extendedKeyUsage=clientAuth\nkeyUsage=critical,digitalSignature,keyEncipherment\n");
  await run(
    [
      "openssl",
      "req",
      "-newkey",
      "ec",
      "-pkeyopt",
      "ec_paramgen_curve:prime256v1",
      "-nodes",
      "-subj",
      subj,
    ].concat(["-keyout", keyPath, "-out", join(outDir, `${name}.csr`)]),
    outDir,
  );
  await run(
    [
      "openssl",
      "x509",
      "-req",
      "-in",
      join(outDir, `${name}.csr`),
      "-CA",
      ca.caCertPath,
      "-CAkey",
      ca.caKeyPath,
      // A random serial each: -CAcreateserial shares one serial file, which parallel signings corrupt.
      "-set_serial",
      `0x${randomBytes(16).toString("hex")}`,
    ].concat(["-days", "30", "-extfile", ext, "-out", certPath]),
    outDir,
  );
  return { certPath, keyPath };
}

/** A throwaway CA and a serving certificate for the given SANs (127.0.0.1/localhost by default), written into dir. */
async function writeCertificates(dir: string, sans = "IP:127.0.0.1,DNS:localhost"): Promise<void> {
  await run(
    [
      "openssl",
      "req",
      "-x509",
      "-newkey",
      "rsa:2048",
      "-nodes",
      "-days",
      "30",
      "-subj",
      "/CN=distort-lab-ca",
      "-keyout",
      "ca.key",
      "-out",
      "ca.crt",
    ],
    dir,
  );
  writeFileSync(join(dir, "san.ext"), `subjectAltName=${sans}\nextendedKeyUsage=serverAuth\n`);
  await run(
    [
      "openssl",
      "req",
      "-newkey",
      "rsa:2048",
      "-nodes",
      "-subj",
      "/CN=kube-apiserver",
      "-keyout",
      "apiserver.key",
      "-out",
      "apiserver.csr",
    ],
    dir,
  );
  await run(
    [
      "openssl",
      "x509",
      "-req",
      "-in",
      "apiserver.csr",
      "-CA",
      "ca.crt",
      "-CAkey",
      "ca.key",
      "-CAcreateserial",
      "-days",
      "30",
      "-extfile",
      "san.ext",
      "-out",
      "apiserver.crt",
    ],
    dir,
  );
  const sa = generateKeyPairSync("rsa", { modulusLength: 2048 });
  writeFileSync(join(dir, "sa.key"), sa.privateKey.export({ type: "pkcs8", format: "pem" }));
  writeFileSync(join(dir, "sa.pub"), sa.publicKey.export({ type: "spki", format: "pem" }));
}

/** A kubeconfig for the admin token; the same shape a user's kubectl reads. */
export function renderKubeconfig(server: string, caPem: string, token: string, user = "admin"): string {
  const ca = Buffer.from(caPem).toString("base64");
  return [
    "apiVersion: v1",
    "kind: Config",
    "clusters:",
    "- name: distort-lab",
    "  cluster:",
    `    server: ${server}`,
    `    certificate-authority-data: ${ca}`,
    "users:",
    `- name: ${user}`,
    "  user:",
    `    token: ${token}`,
    "contexts:",
    "- name: distort-lab",
    "  context:",
    "    cluster: distort-lab",
    `    user: ${user}`,
    "current-context: distort-lab",
    "",
  ].join("\n");
}

async function waitFor(
  what: string,
  timeoutMs: number,
  proc: Subprocess,
  logPath: string,
  probe: () => Promise<boolean>,
) {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (proc.exitCode !== null) {
      throw new Error(`${what} exited with ${proc.exitCode} before becoming ready:\n${tail(logPath)}`);
    }
    if (await probe().catch(() => false)) return;
    await Bun.sleep(100);
  }
  throw new Error(`${what} not ready after ${timeoutMs} ms:\n${tail(logPath)}`);
}

function tail(path: string, lines = 30): string {
  try {
    return readFileSync(path, "utf8").split("\n").slice(-lines).join("\n");
  } catch {
    return "(no log)";
  }
}

/**
 * Starts etcd and kube-apiserver (and kube-controller-manager when asked), waits for readiness
 * and returns handles. On any failure everything started so far is stopped before the error
 * propagates. Builds the tools first when the cache lacks them.
 */
export async function startControlPlane(opts: ControlPlaneOptions = {}): Promise<ControlPlane> {
  const progress = opts.progress ?? (() => {});
  const tools = opts.tools ?? (await ensureTools());
  const ownDir = opts.dir === undefined;
  const dir = opts.dir ?? mkdtempSync(join(tmpdir(), "distort-cp-"));
  mkdirSync(dir, { recursive: true });
  const procs: Subprocess[] = [];
  let stopped = false;

  // With real nodes gone, kube-apiserver's graceful shutdown can wait out connections of kubelets
  // that died with their network namespace; the lab's state is disposable, so wait less.
  const graceMs = opts.cluster ? 3_000 : 10_000;
  const stop = async () => {
    if (stopped) return;
    stopped = true;
    // Reverse order: clients of etcd go first so they do not log a storm of connection errors.
    for (const p of [...procs].reverse()) {
      if (p.exitCode !== null || p.signalCode !== null) continue;
      p.kill("SIGTERM");
      const done = await Promise.race([p.exited.then(() => true), Bun.sleep(graceMs).then(() => false)]);
      if (!done) {
        p.kill("SIGKILL");
        await p.exited;
      }
    }
    if (ownDir) rmSync(dir, { recursive: true, force: true });
  };

  const spawn = (name: string, argv: string[]) => {
    const logPath = join(dir, `${name}.log`);
    // setpriv's parent-death signal kills the process if this runtime dies without calling stop().
    const proc = Bun.spawn(["setpriv", "--pdeathsig", "KILL", "--", ...argv], {
      cwd: dir,
      stdout: Bun.file(logPath),
      stderr: Bun.file(logPath),
      stdin: "ignore",
    });
    procs.push(proc);
    return { proc, logPath };
  };

  try {
    const t0 = performance.now();
    const cluster = opts.cluster;
    const serviceIp = cluster ? firstServiceIp(cluster.serviceCidr) : undefined;
    await writeCertificates(
      dir,
      cluster
        ? [
            `IP:${cluster.address}`,
            "IP:127.0.0.1",
            `IP:${serviceIp}`,
            "DNS:localhost",
            "DNS:kubernetes",
            "DNS:kubernetes.default",
            "DNS:kubernetes.default.svc",
            "DNS:kubernetes.default.svc.cluster.local",
          ].join(",")
        : undefined,
    );
    const caCertPath = join(dir, "ca.crt");
    const caKeyPath = join(dir, "ca.key");
    const kubeletClient = cluster
      ? await signClientCertificate(
          { caCertPath, caKeyPath },
          dir,
          "apiserver-kubelet-client",
          "kube-apiserver-kubelet-client",
          ["system:masters"],
        )
      : undefined;
    const token = randomBytes(24).toString("hex");
    writeFileSync(join(dir, "tokens.csv"), `${token},admin,admin-uid,"system:masters"\n`);
    const caPem = readFileSync(join(dir, "ca.crt"), "utf8");
    const host = cluster?.address ?? "127.0.0.1";
    const [etcdPort, etcdPeer, apiPort] = [await freePort(), await freePort(), await freePort(host)];

    const etcdUrl = `http://127.0.0.1:${etcdPort}`;
    const etcd = spawn("etcd", [
      tools.etcd,
      "--name=distort",
      `--data-dir=${join(dir, "etcd-data")}`,
      `--listen-client-urls=${etcdUrl}`,
      `--advertise-client-urls=${etcdUrl}`,
      `--listen-peer-urls=http://127.0.0.1:${etcdPeer}`,
      `--initial-advertise-peer-urls=http://127.0.0.1:${etcdPeer}`,
      `--initial-cluster=distort=http://127.0.0.1:${etcdPeer}`,
      "--unsafe-no-fsync=true",
      "--log-level=warn",
    ]);
    await waitFor("etcd", 120_000, etcd.proc, etcd.logPath, async () => {
      const r = await fetch(`${etcdUrl}/health`);
      return r.ok && ((await r.json()) as { health?: string }).health === "true";
    });
    progress(`etcd ready on ${etcdUrl} (${Math.round(performance.now() - t0)} ms)`);

    const server = `https://${host}:${apiPort}`;
    const clusterFlags =
      cluster && kubeletClient
        ? [
            `--client-ca-file=${caCertPath}`,
            `--kubelet-client-certificate=${kubeletClient.certPath}`,
            `--kubelet-client-key=${kubeletClient.keyPath}`,
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
          ]
        : ["--authorization-mode=RBAC", "--disable-admission-plugins=ServiceAccount"];
    const api = spawn("kube-apiserver", [
      tools.kubeApiserver,
      `--etcd-servers=${etcdUrl}`,
      `--cert-dir=${dir}`,
      `--tls-cert-file=${join(dir, "apiserver.crt")}`,
      `--tls-private-key-file=${join(dir, "apiserver.key")}`,
      `--secure-port=${apiPort}`,
      `--bind-address=${host}`,
      `--advertise-address=${host}`,
      `--service-cluster-ip-range=${cluster?.serviceCidr ?? "10.0.0.0/24"}`,
      "--allow-privileged=true",
      ...clusterFlags,
      `--token-auth-file=${join(dir, "tokens.csv")}`,
      `--service-account-issuer=${server}/`,
      `--service-account-key-file=${join(dir, "sa.pub")}`,
      `--service-account-signing-key-file=${join(dir, "sa.key")}`,
      `--min-request-timeout=${opts.minRequestTimeoutSeconds ?? 1800}`,
      "--v=1",
    ]);
    const auth = { headers: { authorization: `Bearer ${token}` }, tls: { ca: caPem } };
    await waitFor("kube-apiserver", 300_000, api.proc, api.logPath, async () => {
      const r = await fetch(`${server}/readyz`, auth);
      return r.status === 200;
    });
    progress(`kube-apiserver ready on ${server} (${Math.round(performance.now() - t0)} ms)`);

    const kubeconfigPath = join(dir, "kubeconfig");
    writeFileSync(kubeconfigPath, renderKubeconfig(server, caPem, token), { mode: 0o600 });

    if (opts.controllerManager) {
      const kcmPort = await freePort();
      const kcm = spawn("kube-controller-manager", [
        tools.kubeControllerManager,
        `--kubeconfig=${kubeconfigPath}`,
        "--leader-elect=false",
        "--use-service-account-credentials=false",
        `--secure-port=${kcmPort}`,
        "--bind-address=127.0.0.1",
        `--controllers=${kcmControllers(opts).join(",")}`,
        `--service-account-private-key-file=${join(dir, "sa.key")}`,
        ...(cluster
          ? [
              `--root-ca-file=${caCertPath}`,
              `--node-monitor-grace-period=${cluster.nodeMonitorGracePeriodSeconds ?? 20}s`,
              `--service-cluster-ip-range=${cluster.serviceCidr}`,
            ]
          : []),
        ...(opts.controllerManagerArgs ?? []),
        "--v=1",
      ]);
      await waitFor("kube-controller-manager", 180_000, kcm.proc, kcm.logPath, async () => {
        const r = await fetch(`https://127.0.0.1:${kcmPort}/healthz`, { tls: { rejectUnauthorized: false } });
        return r.status === 200;
      });
      progress(`kube-controller-manager ready (${Math.round(performance.now() - t0)} ms)`);
    }

    if (opts.scheduler) {
      const schedPort = await freePort();
      const sched = spawn("kube-scheduler", [
        tools.kubeScheduler,
        `--kubeconfig=${kubeconfigPath}`,
        `--authentication-kubeconfig=${kubeconfigPath}`,
        `--authorization-kubeconfig=${kubeconfigPath}`,
        "--leader-elect=false",
        `--secure-port=${schedPort}`,
        "--bind-address=127.0.0.1",
        "--v=1",
      ]);
      await waitFor("kube-scheduler", 180_000, sched.proc, sched.logPath, async () => {
        const r = await fetch(`https://127.0.0.1:${schedPort}/healthz`, {
          tls: { rejectUnauthorized: false },
        });
        return r.status === 200;
      });
      progress(`kube-scheduler ready (${Math.round(performance.now() - t0)} ms)`);
    }

    return {
      dir,
      server,
      token,
      caPem,
      kubeconfigPath,
      ports: { etcd: etcdPort, etcdPeer, apiserver: apiPort },
      caCertPath,
      caKeyPath,
      ...(cluster ? { cluster } : {}),
      pids: () => procs.map((p) => p.pid),
      stop,
    };
  } catch (err) {
    await stop();
    throw err;
  }
}
