// The agent's configuration: environment variables (as the DaemonSet sets them) parsed and
// validated in one place. Nothing else in the agent reads process.env.
import * as v from "valibot";
import { MAX_PORTALS } from "../api/nvme-partition.ts";
import { wholeNumber } from "../lib/config-schemas.ts";
import { StorageError } from "../lib/errors.ts";
import { parseDeviceList } from "./discovery/device-filter.ts";
import { parseCidr } from "./discovery/portal-networks.ts";

const bool = v.pipe(
  v.picklist(["true", "false", "1", "0"], "must be true or false"),
  v.transform((s) => s === "true" || s === "1"),
);
const absPath = v.pipe(v.string(), v.regex(/^\//, "must be an absolute path"));

/** DPDK memory nvmf_tgt may take (its -s), in MiB: the hugepages the agent Pod is granted. */
export const SPDK_MEM_SIZE_MB = { min: 256, max: 1_048_576 } as const;

/** Highest rebuild bandwidth cap accepted, in MB/s (bdev_raid_set_options takes a u32). */
export const REBUILD_MAX_BANDWIDTH_MB_SEC = 1_000_000;
/** Most rebuilds one node may run at once (DISTORT_REBUILDS_PER_NODE, the chart's agent.rebuild.perNode). */
/** Bounds of DISTORT_HEARTBEAT_PERIOD_MS (the chart's agent.heartbeatPeriodMs). */
export const HEARTBEAT_PERIOD_MS = { min: 200, max: 2_000 } as const;
export const MAX_REBUILDS_PER_NODE = 64;

/** "a, b,,c" -> ["a", "b", "c"]: a comma-separated list, blanks dropped. */
const commaList = v.transform((s: string) =>
  s
    .split(",")
    .map((x) => x.trim())
    .filter(Boolean),
);

/** Addresses a host can never connect to, so never a portal. */
const WILDCARDS = new Set(["0.0.0.0", "::"]);

const PortalAddresses = v.pipe(
  v.string(),
  v.transform((s) => s.split(",").map((x) => x.trim())),
  v.array(
    v.pipe(
      v.string(),
      v.ip("DISTORT_PORTAL_ADDRESS entries must be IP addresses, comma-separated"),
      v.check((a) => !WILDCARDS.has(a), "DISTORT_PORTAL_ADDRESS must name addresses, not a wildcard"),
    ),
  ),
  v.minLength(1),
  v.maxLength(MAX_PORTALS, `DISTORT_PORTAL_ADDRESS lists more than ${MAX_PORTALS} portals`),
  v.check((l) => new Set(l).size === l.length, "DISTORT_PORTAL_ADDRESS lists an address twice"),
);

const EnvSchema = v.object({
  NODE_NAME: v.pipe(v.string(), v.minLength(1, "NODE_NAME is required (downward API spec.nodeName)")),
  KUBECONFIG: v.optional(absPath),
  DISTORT_NAMESPACE: v.optional(v.string(), "distort-system"),
  DISTORT_BACKENDS: v.optional(
    v.pipe(
      v.string(),
      commaList,
      v.array(v.picklist(["spdk", "kernel"], "DISTORT_BACKENDS entries must be spdk or kernel")),
      v.minLength(1),
    ),
    "spdk,kernel",
  ),
  DISTORT_SPDK_SOCKET: v.optional(absPath, "/var/tmp/spdk.sock"),
  /** argv of nvmf_tgt, space separated; empty: adopt an nvmf_tgt started by someone else. */
  DISTORT_NVMF_TGT: v.optional(v.string(), ""),
  /**
   * true: nvmf_tgt runs in a container (or host service) of its own that outlives the agent, so
   * an agent upgrade never stops it. The agent never starts one; it waits for it, initialises it
   * when it waits in --wait-for-rpc, pings it, and re-verifies every export when it comes back.
   */
  DISTORT_NVMF_TGT_EXTERNAL: v.optional(bool, "false"),
  DISTORT_SPDK_MEM_SIZE_MB: v.optional(wholeNumber(SPDK_MEM_SIZE_MB.min, SPDK_MEM_SIZE_MB.max)),
  /**
   * Subsystems the supervised nvmf_tgt may hold (nvmf_set_max_subsystems at start): one per
   * exported volume plus discovery. SPDK's own default, 1024, would cap a node at 1023 volumes.
   */
  DISTORT_SPDK_MAX_SUBSYSTEMS: v.optional(wholeNumber(2, 65535), "4096"),
  DISTORT_SPDK_CORE_MASK: v.optional(
    v.pipe(v.string(), v.regex(/^0x[0-9a-fA-F]+$/, "must be hex like 0x3")),
    "0x1",
  ),
  /**
   * The nvmf_tgt image carries SPDK commit 197ff0c9a5 (TLS-PSK HKDF salt fix, in v26.01) as a
   * backport; its version cannot say so. Below v26.01 without it, TLS classes are refused.
   */
  DISTORT_SPDK_TLS_SALT_FIX: v.optional(bool, "false"),
  /** SPDK's setup script; empty: drives are already bound (the lab). */
  DISTORT_SPDK_SETUP: v.optional(v.string(), ""),
  DISTORT_HOST_ROOT: v.optional(absPath, "/"),
  /** Where DH-HMAC-CHAP secrets are written for SPDK's file keyring (0700 directory, 0600 files). */
  DISTORT_KEY_DIR: v.optional(absPath, "/var/lib/distort/keys"),
  /**
   * Scratch directory for changed-block records: the agent and nvmf_tgt must both write it at
   * this path (a shallow copy lands in a sparse file there). Unset: changed-block tracking is off.
   */
  DISTORT_BLOCK_METADATA_DIR: v.optional(absPath),
  /**
   * The node's portal address, or several comma-separated (multipath: every export listens on each,
   * the first is the primary). Unset: the RDMA endpoint discovery finds.
   */
  DISTORT_PORTAL_ADDRESS: v.optional(PortalAddresses),
  /**
   * Storage networks, comma-separated CIDRs: every usable address the node has in them is a
   * portal, the first network's first; instead of DISTORT_PORTAL_ADDRESS.
   */
  DISTORT_PORTAL_NETWORKS: v.optional(
    v.pipe(
      v.string(),
      commaList,
      v.minLength(1, "DISTORT_PORTAL_NETWORKS needs at least one CIDR"),
      v.maxLength(MAX_PORTALS, `DISTORT_PORTAL_NETWORKS lists more than ${MAX_PORTALS} networks`),
      v.rawTransform(({ dataset, addIssue, NEVER }) => {
        try {
          return dataset.value.map(parseCidr);
        } catch (err) {
          addIssue({ message: `DISTORT_PORTAL_NETWORKS: ${(err as Error).message}` });
          return NEVER;
        }
      }),
    ),
  ),
  DISTORT_PORTAL_PORT: v.optional(wholeNumber(1, 65535), "4420"),
  /** How long a copy of a replicated volume served here may stay unreachable before it is dropped. */
  DISTORT_NEXUS_DEGRADE_AFTER_MS: v.optional(wholeNumber(1000, 600_000), "10000"),
  /** Bandwidth cap of each rebuild onto a copy of a volume served here, in MB/s; 0: none. */
  DISTORT_REBUILD_MAX_BANDWIDTH_MB_SEC: v.optional(wholeNumber(0, REBUILD_MAX_BANDWIDTH_MB_SEC), "0"),
  /** Most rebuilds running at once on this node (as the serving node of their volumes); 0: none start. */
  DISTORT_REBUILDS_PER_NODE: v.optional(wholeNumber(0, MAX_REBUILDS_PER_NODE), "2"),
  /**
   * Whether a rebuild waits for one of the cluster's rebuild slots, granted by the manager
   * (DISTORT_REBUILDS_PER_CLUSTER). Only an agent run without a manager (tests) turns it off.
   */
  DISTORT_REBUILD_NEEDS_GRANT: v.optional(bool, "true"),
  /**
   * How long a deleted partition's drive must have been lost (Unavailable after a complete scan,
   * or its NVMeDevice removed) before the partition is released without its volume (its room is
   * then held as a leftover until the drive returns and the volume is deleted from it).
   */
  DISTORT_LOST_DRIVE_RELEASE_AFTER_SECONDS: v.optional(wholeNumber(1, 30 * 24 * 3600), "600"),
  DISTORT_REPORT_PERIOD_MS: v.optional(wholeNumber(1000, 3_600_000), "30000"),
  /**
   * How often the node's heartbeat (RDMAStorageNode status.lastHeartbeatTime) is written between
   * full reports: a replicated volume's serving node counts as lost after failoverAfterSeconds
   * (5 s at least) without one, so it must come several times within that bound.
   */
  DISTORT_HEARTBEAT_PERIOD_MS: v.optional(
    wholeNumber(HEARTBEAT_PERIOD_MS.min, HEARTBEAT_PERIOD_MS.max),
    "2000",
  ),
  DISTORT_VERIFY_PERIOD_MS: v.optional(wholeNumber(1000, 3_600_000), "60000"),
  /** How often the node statistics (SPDK iostat, lvstores, reactors, hosts) are read for /metrics. */
  DISTORT_METRICS_PERIOD_MS: v.optional(wholeNumber(1000, 3_600_000), "15000"),
  DISTORT_HEALTH_PORT: v.optional(wholeNumber(0, 65535), "9810"),
  DISTORT_LOG_LEVEL: v.optional(v.picklist(["debug", "info", "warn", "error"]), "info"),
  NVME_ALLOWED_DEVICES: v.optional(v.string()),
  NVME_EXCLUDE_DEVICES: v.optional(v.string()),
  /** Fault injection for crash tests: the agent kills itself right after this reconcile step. */
  DISTORT_FAULT_CRASH_AFTER: v.optional(v.string()),
});

export type AgentConfig = ReturnType<typeof parseAgentConfig>;

/** Parses the environment; a bad value is a StorageError naming the variable and the rule. */
export function parseAgentConfig(env: Record<string, string | undefined>) {
  const r = v.safeParse(EnvSchema, env);
  if (!r.success) {
    const msgs = r.issues.map((i) => `${v.getDotPath(i) ?? "env"}: ${i.message}`);
    throw new StorageError("invalid", `agent configuration: ${msgs.join("; ")}`);
  }
  const c = r.output;
  if (c.DISTORT_PORTAL_NETWORKS && c.DISTORT_PORTAL_ADDRESS) {
    throw new StorageError(
      "invalid",
      "agent configuration: set DISTORT_PORTAL_ADDRESS (the addresses) or DISTORT_PORTAL_NETWORKS (the networks to find them in), not both",
    );
  }
  if (c.DISTORT_NVMF_TGT_EXTERNAL && c.DISTORT_NVMF_TGT.trim() !== "") {
    throw new StorageError(
      "invalid",
      "agent configuration: DISTORT_NVMF_TGT_EXTERNAL=true means another container runs nvmf_tgt; DISTORT_NVMF_TGT (a command for the agent to start) must then be empty",
    );
  }
  return {
    nodeName: c.NODE_NAME,
    kubeconfig: c.KUBECONFIG,
    namespace: c.DISTORT_NAMESPACE,
    backends: c.DISTORT_BACKENDS,
    spdkSocket: c.DISTORT_SPDK_SOCKET,
    nvmfTgtCommand: c.DISTORT_NVMF_TGT.split(" ").filter(Boolean),
    nvmfTgtExternal: c.DISTORT_NVMF_TGT_EXTERNAL,
    coreMask: c.DISTORT_SPDK_CORE_MASK,
    spdkMemSizeMb: c.DISTORT_SPDK_MEM_SIZE_MB,
    spdkMaxSubsystems: c.DISTORT_SPDK_MAX_SUBSYSTEMS,
    spdkSetup: c.DISTORT_SPDK_SETUP,
    spdkTlsSaltFix: c.DISTORT_SPDK_TLS_SALT_FIX,
    hostRoot: c.DISTORT_HOST_ROOT,
    keyDir: c.DISTORT_KEY_DIR,
    blockMetadataDir: c.DISTORT_BLOCK_METADATA_DIR,
    /** Configured portal addresses, the primary first; undefined: discovery picks one. */
    portalAddresses: c.DISTORT_PORTAL_ADDRESS,
    /** Networks the portal addresses are found in at start-up; undefined: see portalAddresses. */
    portalNetworks: c.DISTORT_PORTAL_NETWORKS,
    portalPort: c.DISTORT_PORTAL_PORT,
    nexusDegradeAfterMs: c.DISTORT_NEXUS_DEGRADE_AFTER_MS,
    rebuildBandwidthMbSec: c.DISTORT_REBUILD_MAX_BANDWIDTH_MB_SEC,
    rebuildsPerNode: c.DISTORT_REBUILDS_PER_NODE,
    rebuildNeedsGrant: c.DISTORT_REBUILD_NEEDS_GRANT,
    lostDriveReleaseAfterMs: c.DISTORT_LOST_DRIVE_RELEASE_AFTER_SECONDS * 1000,
    reportPeriodMs: c.DISTORT_REPORT_PERIOD_MS,
    heartbeatPeriodMs: c.DISTORT_HEARTBEAT_PERIOD_MS,
    verifyPeriodMs: c.DISTORT_VERIFY_PERIOD_MS,
    metricsPeriodMs: c.DISTORT_METRICS_PERIOD_MS,
    healthPort: c.DISTORT_HEALTH_PORT,
    logLevel: c.DISTORT_LOG_LEVEL,
    deviceFilter: {
      allowed: parseDeviceList(c.NVME_ALLOWED_DEVICES),
      excluded: parseDeviceList(c.NVME_EXCLUDE_DEVICES),
    },
    crashAfter: c.DISTORT_FAULT_CRASH_AFTER,
  };
}
