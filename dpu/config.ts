// The DPU plugin's configuration from environment variables (as the DaemonSet sets them), parsed
// and validated with valibot in one place. Nothing else in dpu/ reads process.env.
import { isAbsolute } from "node:path";
import * as v from "valibot";
import { wholeNumber } from "../lib/config-schemas.ts";
import { StorageError } from "../lib/errors.ts";
import { HOSTNQN_PATH } from "../lib/host-nqn.ts";
import { nqnProblem } from "../lib/spdk/nqn.ts";
import { FS_TYPES, type FsType } from "./devices/request.ts";

/** Where DPF's SNAP node driver looks for vendor plugins and SNAP sockets. */
export const DPF_PLUGIN_DIR = "/var/lib/nvidia/storage/snap/plugins";
export const DPF_PROVIDER_DIR = "/var/lib/nvidia/storage/snap/providers";
/** The provider directory of NVIDIA's default SNAP process. */
export const DEFAULT_PROVIDER_DIR_NAME = "nvidia";
// Linux's sun_path holds 108 bytes including the terminating NUL.
const MAX_SOCKET_PATH_BYTES = 107;

/** Each setting: the environment variables consulted (first non-empty wins) and the default. */
const OPTIONS = {
  pluginName: { env: ["DISTORT_DPU_PLUGIN_NAME"], default: "distort" },
  socketPath: { env: ["DISTORT_DPU_SOCKET"], default: undefined },
  csiSocketPath: { env: ["DISTORT_DPU_CSI_SOCKET"], default: undefined },
  snapProvider: { env: ["DISTORT_DPU_SNAP_PROVIDER"], default: "" },
  snapSocketPath: { env: ["DISTORT_DPU_SNAP_SOCKET"], default: undefined },
  hostNqn: { env: ["DISTORT_DPU_HOST_NQN"], default: undefined },
  hostNqnFile: { env: ["DISTORT_DPU_HOST_NQN_FILE"], default: HOSTNQN_PATH },
  nodeName: { env: ["NODE_NAME"], default: undefined },
  stateDir: { env: ["DISTORT_DPU_STATE_DIR"], default: "/var/lib/distort/dpu/state" },
  keyDir: { env: ["DISTORT_DPU_KEY_DIR"], default: "/var/lib/distort/dpu/keys" },
  mountRoot: { env: ["DISTORT_DPU_MOUNT_ROOT"], default: "/var/lib/distort/dpu/mounts" },
  secretNamespace: { env: ["DISTORT_DPU_SECRET_NAMESPACE", "POD_NAMESPACE"], default: "distort-system" },
  kubeconfig: { env: ["KUBECONFIG"], default: undefined },
  kubernetesServiceHost: { env: ["KUBERNETES_SERVICE_HOST"], default: undefined },
  tcpTrtype: { env: ["DISTORT_DPU_TCP_TRTYPE"], default: "TCP" },
  rdmaTrtype: { env: ["DISTORT_DPU_RDMA_TRTYPE"], default: "RDMA" },
  defaultFsType: { env: ["DISTORT_DPU_FS_TYPE"], default: "ext4" },
  snapTimeoutMs: { env: ["DISTORT_DPU_SNAP_TIMEOUT_MS"], default: "30000" },
  commandTimeoutMs: { env: ["DISTORT_DPU_COMMAND_TIMEOUT_MS"], default: "300000" },
  healthHost: { env: ["DISTORT_HEALTH_HOST"], default: "0.0.0.0" },
  healthPort: { env: ["DISTORT_HEALTH_PORT"], default: "9812" },
  logLevel: { env: ["DISTORT_LOG_LEVEL"], default: "info" },
  shutdownGraceMs: { env: ["DISTORT_DPU_SHUTDOWN_GRACE_MS"], default: "10000" },
} as const satisfies Record<string, { env: readonly string[]; default: string | undefined }>;

type Key = keyof typeof OPTIONS;

/** A DNS-label-like name, usable as a directory name (plugin and provider names). */
const dirName = (what: string) =>
  v.pipe(
    v.string(),
    v.regex(/^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$/, `${what} must be lowercase letters, digits, "-" and "."`),
    v.maxLength(63, `${what} must be at most 63 characters`),
  );

const socketPath = (what: string) =>
  v.pipe(
    v.string(),
    v.check(isAbsolute, `${what} must be an absolute path`),
    v.check(
      (p) => Buffer.byteLength(p) <= MAX_SOCKET_PATH_BYTES,
      `${what} must be at most ${MAX_SOCKET_PATH_BYTES} bytes (a unix socket path)`,
    ),
  );

const absDir = (what: string) => v.pipe(v.string(), v.check(isAbsolute, `${what} must be an absolute path`));
const trtype = (what: string) =>
  v.pipe(
    v.string(),
    v.regex(/^[A-Za-z][A-Za-z0-9_]{0,30}$/, `${what} must be a transport name such as TCP, RDMA or NVDA_TCP`),
  );

const RawSchema = v.object({
  pluginName: dirName("DISTORT_DPU_PLUGIN_NAME"),
  socketPath: v.optional(socketPath("DISTORT_DPU_SOCKET")),
  csiSocketPath: v.optional(socketPath("DISTORT_DPU_CSI_SOCKET")),
  snapProvider: v.union(
    [v.literal(""), dirName("DISTORT_DPU_SNAP_PROVIDER")],
    "DISTORT_DPU_SNAP_PROVIDER must be empty or a directory name",
  ),
  snapSocketPath: v.optional(socketPath("DISTORT_DPU_SNAP_SOCKET")),
  hostNqn: v.optional(
    v.pipe(
      v.string(),
      v.rawCheck(({ dataset, addIssue }) => {
        if (!dataset.typed) return;
        const problem = nqnProblem(dataset.value);
        if (problem !== undefined) addIssue({ message: `DISTORT_DPU_HOST_NQN: ${problem}` });
      }),
    ),
  ),
  hostNqnFile: absDir("DISTORT_DPU_HOST_NQN_FILE"),
  nodeName: v.optional(v.pipe(v.string(), v.maxLength(253, "NODE_NAME must be at most 253 characters"))),
  stateDir: absDir("DISTORT_DPU_STATE_DIR"),
  keyDir: absDir("DISTORT_DPU_KEY_DIR"),
  mountRoot: absDir("DISTORT_DPU_MOUNT_ROOT"),
  secretNamespace: v.pipe(
    v.string(),
    v.regex(/^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/, "DISTORT_DPU_SECRET_NAMESPACE must be a namespace name"),
    v.maxLength(63),
  ),
  kubeconfig: v.optional(absDir("KUBECONFIG")),
  kubernetesServiceHost: v.optional(v.string()),
  tcpTrtype: trtype("DISTORT_DPU_TCP_TRTYPE"),
  rdmaTrtype: trtype("DISTORT_DPU_RDMA_TRTYPE"),
  defaultFsType: v.picklist(FS_TYPES, `DISTORT_DPU_FS_TYPE must be one of ${FS_TYPES.join(", ")}`),
  snapTimeoutMs: wholeNumber(100, 600_000, "DISTORT_DPU_SNAP_TIMEOUT_MS"),
  commandTimeoutMs: wholeNumber(1000, 3_600_000, "DISTORT_DPU_COMMAND_TIMEOUT_MS"),
  healthHost: v.pipe(v.string(), v.ip("DISTORT_HEALTH_HOST must be an IP address")),
  healthPort: wholeNumber(0, 65535, "DISTORT_HEALTH_PORT"),
  logLevel: v.picklist(
    ["debug", "info", "warn", "error"],
    "DISTORT_LOG_LEVEL must be debug, info, warn or error",
  ),
  shutdownGraceMs: wholeNumber(0, 600_000, "DISTORT_DPU_SHUTDOWN_GRACE_MS"),
});

export interface DpuConfig {
  /** The DPF plugin name (StorageVendor spec.pluginName): the directory of the plugin socket. */
  pluginName: string;
  /** The gRPC socket the SNAP node driver dials. */
  socketPath: string;
  /**
   * The CSI socket (Identity and NodeGetInfo only) kubelet registers through the node-driver
   * registrar, so that kubelet records this DPU's node ID, and with it its host NQN, in the
   * DPU Node's CSINode. Unset: not served (nothing then tells ControllerPublish the host NQN).
   */
  csiSocketPath?: string;
  /** GetSNAPProvider's answer; "" for NVIDIA's default SNAP. */
  snapProvider: string;
  /** SNAP's JSON-RPC socket. */
  snapSocketPath: string;
  /** The NQN SNAP connects to targets as, when configured; else read from hostNqnFile at start. */
  hostNqn?: string;
  /** The DPU's persistent host NQN file (nvme-cli's), used when hostNqn is not set. */
  hostNqnFile: string;
  /** This DPU's Kubernetes Node: the node name in the CSI node ID (with the host NQN). */
  nodeName?: string;
  stateDir: string;
  keyDir: string;
  mountRoot: string;
  /** Where the DH-HMAC-CHAP Secrets named by storage parameters live. */
  secretNamespace: string;
  /** Kubeconfig for reading Secrets; undefined uses the in-cluster service account when there is one. */
  kubeconfig?: string;
  /** True inside a Pod (KUBERNETES_SERVICE_HOST is set). */
  inCluster: boolean;
  /** SNAP's trtype for each DISTORT transport. */
  trtypes: { tcp: string; rdma: string };
  defaultFsType: FsType;
  snapTimeoutMs: number;
  commandTimeoutMs: number;
  health: { host: string; port: number };
  logLevel: "debug" | "info" | "warn" | "error";
  shutdownGraceMs: number;
}

/** The settings, their variables and defaults, for --help style output. */
export const USAGE = `distort-dpu is configured through the environment:
${Object.values(OPTIONS)
  .map(
    (o) => `  ${o.env.join(" | ").padEnd(44)} default ${o.default === "" ? '""' : (o.default ?? "(none)")}`,
  )
  .join("\n")}`;

/** Builds the configuration from `env`. Throws StorageError("invalid") naming every bad variable. */
export function parseDpuConfig(env: Readonly<Record<string, string | undefined>>): DpuConfig {
  const raw: Record<string, string | undefined> = {};
  for (const [k, o] of Object.entries(OPTIONS) as [Key, (typeof OPTIONS)[Key]][]) {
    const fromEnv = o.env.map((e) => env[e]).find((x) => x !== undefined && x !== "");
    raw[k] = fromEnv ?? o.default;
  }
  const r = v.safeParse(RawSchema, raw);
  if (!r.success) {
    throw new StorageError("invalid", `configuration: ${r.issues.map((i) => i.message).join("; ")}`);
  }
  const c = r.output;
  const provider = c.snapProvider === "" ? DEFAULT_PROVIDER_DIR_NAME : c.snapProvider;
  const socket = c.socketPath ?? `${DPF_PLUGIN_DIR}/${c.pluginName}/dpu.sock`;
  if (Buffer.byteLength(socket) > MAX_SOCKET_PATH_BYTES) {
    throw new StorageError(
      "invalid",
      `configuration: plugin socket ${socket} is longer than ${MAX_SOCKET_PATH_BYTES} bytes`,
    );
  }
  return {
    pluginName: c.pluginName,
    socketPath: socket,
    ...(c.csiSocketPath ? { csiSocketPath: c.csiSocketPath } : {}),
    snapProvider: c.snapProvider,
    snapSocketPath: c.snapSocketPath ?? `${DPF_PROVIDER_DIR}/${provider}/snap.sock`,
    ...(c.hostNqn ? { hostNqn: c.hostNqn } : {}),
    hostNqnFile: c.hostNqnFile,
    ...(c.nodeName ? { nodeName: c.nodeName } : {}),
    stateDir: c.stateDir,
    keyDir: c.keyDir,
    mountRoot: c.mountRoot,
    secretNamespace: c.secretNamespace,
    ...(c.kubeconfig ? { kubeconfig: c.kubeconfig } : {}),
    inCluster: c.kubernetesServiceHost !== undefined,
    trtypes: { tcp: c.tcpTrtype, rdma: c.rdmaTrtype },
    defaultFsType: c.defaultFsType,
    snapTimeoutMs: c.snapTimeoutMs,
    commandTimeoutMs: c.commandTimeoutMs,
    health: { host: c.healthHost, port: c.healthPort },
    logLevel: c.logLevel,
    shutdownGraceMs: c.shutdownGraceMs,
  };
}
