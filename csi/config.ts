// The CSI binary's configuration: command-line flags (as the chart's container args set them) over
// environment variables over defaults, parsed and validated with valibot in one place. Nothing
// else in csi/ reads process.env or argv.
import { isAbsolute } from "node:path";
import * as v from "valibot";
import { wholeNumber } from "../lib/config-schemas.ts";
import { StorageError } from "../lib/errors.ts";
import { MAX_NAMESPACE_LENGTH } from "./controller/volume-id.ts";

/** Each option: its flag, the environment variables consulted when the flag is absent, a default. */
const OPTIONS = {
  endpoint: { flag: "endpoint", env: ["CSI_ENDPOINT"], default: "unix:///csi/csi.sock" },
  mode: { flag: "mode", env: ["DISTORT_CSI_MODE"], default: "all" },
  nodeId: { flag: "node-id", env: ["NODE_ID", "NODE_NAME"], default: undefined },
  kubeconfig: { flag: "kubeconfig", env: ["KUBECONFIG"], default: undefined },
  namespace: { flag: "namespace", env: ["DISTORT_NAMESPACE"], default: "distort-system" },
  healthHost: { flag: "health-host", env: ["DISTORT_HEALTH_HOST"], default: "0.0.0.0" },
  healthPort: { flag: "health-port", env: ["DISTORT_HEALTH_PORT"], default: "9811" },
  logLevel: { flag: "log-level", env: ["DISTORT_LOG_LEVEL"], default: "info" },
  defaultTimeoutMs: { flag: "default-timeout-ms", env: ["DISTORT_CSI_DEFAULT_TIMEOUT_MS"], default: "60000" },
  defaultVolumeBytes: {
    flag: "default-volume-bytes",
    env: ["DISTORT_CSI_DEFAULT_VOLUME_BYTES"],
    default: String(1024 ** 3),
  },
  shutdownGraceMs: { flag: "shutdown-grace-ms", env: ["DISTORT_CSI_SHUTDOWN_GRACE_MS"], default: "10000" },
  stateDir: { flag: "state-dir", env: ["DISTORT_CSI_STATE_DIR"], default: "/var/lib/distort/csi" },
  hostRoot: { flag: "host-root", env: ["DISTORT_HOST_ROOT"], default: "/" },
  keyDir: { flag: "key-dir", env: ["DISTORT_CSI_KEY_DIR"], default: "/run/distort/csi-keys" },
  kubeletDir: { flag: "kubelet-dir", env: ["DISTORT_CSI_KUBELET_DIR"], default: undefined },
  topologyKeys: { flag: "topology-keys", env: ["DISTORT_CSI_TOPOLOGY_KEYS"], default: "" },
  maxVolumesPerNode: {
    flag: "max-volumes-per-node",
    env: ["DISTORT_CSI_MAX_VOLUMES_PER_NODE"],
    default: "0",
  },
  orphanGraceMs: { flag: "orphan-grace-ms", env: ["DISTORT_CSI_ORPHAN_GRACE_MS"], default: "120000" },
  orphanSweepMs: { flag: "orphan-sweep-ms", env: ["DISTORT_CSI_ORPHAN_SWEEP_MS"], default: "30000" },
  stagingSweepMs: {
    flag: "staging-sweep-ms",
    env: ["DISTORT_CSI_STAGING_SWEEP_MS"],
    default: "60000",
  },
  heartbeatStalenessMs: {
    flag: "heartbeat-staleness-ms",
    env: ["DISTORT_HEARTBEAT_STALENESS_MS"],
    default: "90000",
  },
  nodeTools: {
    flag: "node-tools",
    env: ["DISTORT_CSI_NODE_TOOLS"],
    default: "nvme,blkid,mkfs.ext4,mkfs.xfs,mount,umount",
  },
} as const satisfies Record<string, { flag: string; env: readonly string[]; default: string | undefined }>;

type Key = keyof typeof OPTIONS;

const commaList = v.pipe(
  v.string(),
  v.transform((s) =>
    s
      .split(",")
      .map((t) => t.trim())
      .filter(Boolean),
  ),
);

// Optional DNS-subdomain prefix and "/", then a label name.
const LABEL_KEY =
  /^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$/;

const RawSchema = v.object({
  endpoint: v.pipe(
    v.string(),
    v.transform((s) => (s.startsWith("unix://") ? s.slice("unix://".length) : s)),
    v.check((p) => isAbsolute(p), "endpoint must be unix:///absolute/path.sock (or an absolute path)"),
  ),
  mode: v.picklist(["controller", "node", "all"], "mode must be controller, node or all"),
  nodeId: v.optional(v.pipe(v.string(), v.minLength(1, "node-id must not be empty"), v.maxLength(253))),
  kubeconfig: v.optional(v.pipe(v.string(), v.check(isAbsolute, "kubeconfig must be an absolute path"))),
  namespace: v.pipe(
    v.string(),
    v.regex(/^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/, "namespace must be a DNS label"),
    v.maxLength(
      MAX_NAMESPACE_LENGTH,
      `namespace must be at most ${MAX_NAMESPACE_LENGTH} characters, so volume ids fit CSI's 128 bytes`,
    ),
  ),
  healthHost: v.pipe(v.string(), v.ip("health-host must be an IP address")),
  healthPort: wholeNumber(0, 65535, "health-port"),
  logLevel: v.picklist(["debug", "info", "warn", "error"], "log-level must be debug, info, warn or error"),
  defaultTimeoutMs: wholeNumber(1000, 3_600_000, "default-timeout-ms"),
  defaultVolumeBytes: v.pipe(
    wholeNumber(4 * 1024 * 1024, Number.MAX_SAFE_INTEGER, "default-volume-bytes"),
    v.check((n) => n % (4 * 1024 * 1024) === 0, "default-volume-bytes must be a multiple of 4 MiB"),
  ),
  shutdownGraceMs: wholeNumber(0, 600_000, "shutdown-grace-ms"),
  stateDir: v.pipe(v.string(), v.check(isAbsolute, "state-dir must be an absolute path")),
  hostRoot: v.pipe(v.string(), v.check(isAbsolute, "host-root must be an absolute path")),
  keyDir: v.pipe(v.string(), v.check(isAbsolute, "key-dir must be an absolute path")),
  kubeletDir: v.optional(
    v.pipe(
      v.string(),
      v.check((d) => isAbsolute(d) && d !== "/", "kubelet-dir must be an absolute path below /"),
    ),
  ),
  topologyKeys: v.pipe(
    commaList,
    v.check(
      (keys) => keys.every((k) => LABEL_KEY.test(k)),
      "topology-keys must be Node label keys, e.g. topology.kubernetes.io/zone",
    ),
  ),
  maxVolumesPerNode: wholeNumber(0, 1_000_000, "max-volumes-per-node"),
  orphanGraceMs: wholeNumber(0, 86_400_000, "orphan-grace-ms"),
  orphanSweepMs: wholeNumber(1000, 3_600_000, "orphan-sweep-ms"),
  stagingSweepMs: v.pipe(
    wholeNumber(0, 3_600_000, "staging-sweep-ms"),
    v.check((n) => n === 0 || n >= 1000, "staging-sweep-ms must be 0 (off) or >= 1000"),
  ),
  heartbeatStalenessMs: wholeNumber(1000, 86_400_000, "heartbeat-staleness-ms"),
  nodeTools: commaList,
});

export type CsiMode = "controller" | "node" | "all";

export interface CsiConfig {
  /** Absolute path of the UNIX socket the services listen on. */
  socketPath: string;
  mode: CsiMode;
  /** This node's CSI node id (the Kubernetes node name); required in node and all modes. */
  nodeId?: string;
  /** Kubeconfig file; undefined means the in-cluster service account. */
  kubeconfig?: string;
  /** Namespace of NVMePartitions and NVMeVolumeAttachments. */
  namespace: string;
  health: { host: string; port: number };
  logLevel: "debug" | "info" | "warn" | "error";
  /** Wait budget of calls without a deadline. */
  defaultTimeoutMs: number;
  /** Size of a CreateVolume without a capacity range. */
  defaultVolumeBytes: number;
  /** How long SIGTERM lets in-flight calls finish. */
  shutdownGraceMs: number;
  /** Where the node service keeps its per-volume records. */
  stateDir: string;
  /** Root of the host filesystem the node service sees (/etc/nvme/hostnqn, /dev, /proc). */
  hostRoot: string;
  /**
   * Where keyed connects put nvme-cli's configuration (0600, for the length of one connect):
   * best a memory filesystem (/run), never a shared or persistent volume.
   */
  keyDir: string;
  /** kubelet's root directory; when set, the node service publishes and unpublishes only below it. */
  kubeletDir?: string;
  /** Node label keys whose values NodeGetInfo reports as this node's topology. */
  topologyKeys: string[];
  /** NodeGetInfo max_volumes_per_node; 0 leaves the limit to the CO. */
  maxVolumesPerNode: number;
  /**
   * How old a claim-annotated partition without claim or PV must be before the controller deletes
   * it as orphaned: longer than a CreateVolume plus the provisioner's retry, so neither is raced.
   */
  orphanGraceMs: number;
  /** Interval of the controller's orphan sweeps. */
  orphanSweepMs: number;
  /**
   * Interval of the node service's sweep of staged volumes kubelet forgot (csi/node/staging-sweep.ts);
   * 0 turns it off, for a node plugin outside Kubernetes (csi-sanity, a lab without an
   * attach/detach controller), where no Node status says what is attached.
   */
  stagingSweepMs: number;
  /** Heartbeat age past which volume health reports a storage node's volumes INACCESSIBLE. */
  heartbeatStalenessMs: number;
  /** Commands a node-mode Probe requires on PATH; empty disables the check. */
  nodeTools: string[];
}

export const USAGE = `usage: distort-csi [--flag=value ...]
${Object.values(OPTIONS)
  .map((o) => `  --${o.flag.padEnd(22)} env ${o.env.join(" | ").padEnd(34)} default ${o.default ?? "(none)"}`)
  .join("\n")}
  --mode=registrar and --mode=liveness run DISTORT's node-driver-registrar and livenessprobe
  equivalents with the upstream sidecars' flags instead (csi/sidecar/config.ts).`;

/** Reads "--flag=value" and "--flag value" pairs; unknown flags and missing values are errors. */
function readFlags(argv: readonly string[]): Partial<Record<Key, string>> {
  const byFlag = new Map<string, Key>(Object.entries(OPTIONS).map(([k, o]) => [o.flag, k as Key]));
  const out: Partial<Record<Key, string>> = {};
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i] as string;
    if (!arg.startsWith("--"))
      throw new StorageError("invalid", `unexpected argument ${JSON.stringify(arg)}`);
    const eq = arg.indexOf("=");
    const flag = arg.slice(2, eq < 0 ? undefined : eq);
    const key = byFlag.get(flag);
    if (!key) throw new StorageError("invalid", `unknown flag --${flag}`);
    let value: string | undefined;
    if (eq >= 0) value = arg.slice(eq + 1);
    else {
      value = argv[++i];
      if (value === undefined) throw new StorageError("invalid", `--${flag} needs a value`);
    }
    out[key] = value;
  }
  return out;
}

/**
 * Builds the configuration from `argv` (without the program name) and `env`. Throws
 * StorageError("invalid") naming each bad option by its flag.
 */
export function parseCsiConfig(
  argv: readonly string[],
  env: Readonly<Record<string, string | undefined>>,
): CsiConfig {
  const flags = readFlags(argv);
  const raw: Record<string, string | undefined> = {};
  for (const [k, o] of Object.entries(OPTIONS) as [Key, (typeof OPTIONS)[Key]][]) {
    const fromEnv = o.env.map((e) => env[e]).find((x) => x !== undefined && x !== "");
    raw[k] = flags[k] ?? fromEnv ?? o.default;
  }
  const r = v.safeParse(RawSchema, raw);
  if (!r.success) {
    const msgs = r.issues.map((i) => {
      const k = v.getDotPath(i) as Key | null;
      return k && k in OPTIONS ? `--${OPTIONS[k].flag}: ${i.message}` : i.message;
    });
    throw new StorageError("invalid", `CSI configuration: ${msgs.join("; ")}`);
  }
  const c = r.output;
  if (c.mode !== "controller" && !c.nodeId)
    throw new StorageError(
      "invalid",
      `CSI configuration: --node-id (or NODE_ID) is required in ${c.mode} mode`,
    );
  return {
    socketPath: c.endpoint,
    mode: c.mode,
    ...(c.nodeId === undefined ? {} : { nodeId: c.nodeId }),
    ...(c.kubeconfig === undefined ? {} : { kubeconfig: c.kubeconfig }),
    namespace: c.namespace,
    health: { host: c.healthHost, port: c.healthPort },
    logLevel: c.logLevel,
    defaultTimeoutMs: c.defaultTimeoutMs,
    defaultVolumeBytes: c.defaultVolumeBytes,
    shutdownGraceMs: c.shutdownGraceMs,
    stateDir: c.stateDir,
    hostRoot: c.hostRoot,
    keyDir: c.keyDir,
    ...(c.kubeletDir === undefined ? {} : { kubeletDir: c.kubeletDir.replace(/\/+$/, "") }),
    topologyKeys: c.topologyKeys,
    maxVolumesPerNode: c.maxVolumesPerNode,
    orphanGraceMs: c.orphanGraceMs,
    orphanSweepMs: c.orphanSweepMs,
    stagingSweepMs: c.stagingSweepMs,
    heartbeatStalenessMs: c.heartbeatStalenessMs,
    nodeTools: c.nodeTools,
  };
}
