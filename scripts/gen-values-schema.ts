// The chart's values, as valibot schemas, and their rendering into helm/distort/values.schema.json
// (JSON Schema draft-07, which helm enforces on install, upgrade, template and lint). Enumerations
// and ranges come from the binaries' own constants; helm/values-schema.test.ts checks the rest.

import { readFileSync, writeFileSync } from "node:fs";
import { join, relative, resolve } from "node:path";
import * as v from "valibot";
import {
  HEARTBEAT_PERIOD_MS,
  MAX_REBUILDS_PER_NODE,
  REBUILD_MAX_BANDWIDTH_MB_SEC,
  SPDK_MEM_SIZE_MB,
} from "../agent/config.ts";
import { WATCHDOG_POLL_MS } from "../agent/watchdog/main.ts";
import { BackendSchema, intRange, TransportSchema } from "../api/common.ts";
import {
  MAX_PORTALS,
  MAX_QOS_IOPS,
  MAX_QOS_MBPS,
  QOS_IOPS_UNIT,
  VolumeManagerSchema,
} from "../api/nvme-partition.ts";
import { SUPPORTED_FS_TYPES } from "../csi/controller/capabilities.ts";
import { MAX_LCORES } from "../lib/spdk/core-mask.ts";
import { MAX_REBUILDS_PER_CLUSTER } from "../manager/config.ts";

const ROOT = resolve(import.meta.dir, "..");
export const VALUES_SCHEMA_PATH = join(ROOT, "helm", "distort", "values.schema.json");

// ---- building blocks -------------------------------------------------------------------------

/** Upper bound of the lost-drive and lost-node release delays (agent/config.ts, manager/config.ts): 30 days. */
const LOST_RELEASE_MAX_SECONDS = 30 * 24 * 3600;
const int = (min: number, max = Number.MAX_SAFE_INTEGER) => intRange(min, max);
/**
 * An integer from `min` to `max` whose refusals name the value and its range. The messages are
 * ValuesSchema's (tests, tooling); helm enforces the JSON Schema rendering, the same bounds, with
 * its own wording ("at '/agent/rebuild/perNode': maximum: got 65, want 64").
 */
const wholeNumberIn = (path: string, min: number, max: number, what: string) => {
  const range = `${path} must be a whole number from ${min} to ${max}`;
  return v.pipe(
    v.number(range),
    v.integer(range),
    v.minValue(min, range),
    v.maxValue(max, range),
    v.description(what),
  );
};
const port = (what: string) => v.pipe(int(1, 65535), v.description(what));
const ms = (min: number, max: number, what: string) => v.pipe(int(min, max), v.description(`${what} (ms)`));
const text = (what: string) => v.pipe(v.string(), v.description(what));
const DNS_SUBDOMAIN = /^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$/;
const DNS_LABEL = /^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/;
/** An IPv4 or IPv6 CIDR, as ClusterNetworkPolicy's `networks` takes them (address/prefix). */
const CIDR =
  /^((25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])(\.(25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])){3}\/(3[0-2]|[12]?[0-9])|[0-9a-fA-F:]*:[0-9a-fA-F:.]*\/(12[0-8]|1[01][0-9]|[1-9]?[0-9]))$/;
const name = (what: string) => v.pipe(v.string(), v.regex(DNS_SUBDOMAIN), v.description(what));
const absPath = (what: string) => v.pipe(v.string(), v.regex(/^\//), v.description(what));
const absPathOrNone = (what: string) => v.pipe(v.string(), v.regex(/^$|^\//), v.description(what));
// A Go duration as the sidecars' flags take it.
const duration = (what: string) => v.pipe(v.string(), v.regex(/^([0-9]+(ms|s|m|h))+$/), v.description(what));
const QUANTITY = /^[0-9]+(\.[0-9]+)?(m|Ki|Mi|Gi|Ti|k|M|G|T)?$/;
// A YAML number is a quantity too ("cpu: 2").
const quantity = v.union([v.pipe(v.string(), v.regex(QUANTITY)), v.pipe(v.number(), v.minValue(0))]);
const cpuMemory = v.strictObject({
  cpu: quantity,
  memory: quantity,
  "ephemeral-storage": v.optional(quantity),
});
/** Requests and limits are both mandatory: every container of the chart carries them. */
const resources = (what: string) =>
  v.pipe(v.strictObject({ requests: cpuMemory, limits: cpuMemory }), v.description(what));
// Free-form Kubernetes fragments handed to the Pod spec unchanged (the API server validates them).
const anyObject = (what: string) => v.pipe(v.record(v.string(), v.unknown()), v.description(what));
const anyList = (what: string) => v.pipe(v.array(v.record(v.string(), v.unknown())), v.description(what));
const stringMap = (what: string) => v.pipe(v.record(v.string(), v.string()), v.description(what));
const image = v.strictObject({
  repository: text("image repository"),
  tag: text("image tag; empty means the chart's appVersion"),
});
const strings = (what: string) => v.pipe(v.array(v.string()), v.description(what));
/**
 * A CSI sidecar: its image (or a repository and tag, which win over it), an optional command
 * replacing the image's entrypoint, optional resources replacing the Pod's sidecar resources.
 * `distortEquivalent`: no image and no repository selects DISTORT's own equivalent in the csi
 * image (nodeDriverRegistrar, livenessProbe); the template refuses an empty one elsewhere.
 */
const sidecar = (distortEquivalent: boolean) =>
  v.strictObject({
    image: v.optional(
      text(
        distortEquivalent
          ? "full image reference; empty (and no repository): DISTORT's own equivalent in the csi image"
          : "full image reference (or give repository)",
      ),
    ),
    repository: v.optional(text("image repository; when set it wins over image")),
    tag: v.optional(text("tag of repository; empty means images.tag, else the chart's appVersion")),
    command: v.optional(
      v.pipe(
        v.array(v.pipe(v.string(), v.minLength(1))),
        v.description("replaces the image's entrypoint; empty keeps it"),
      ),
    ),
    resources: v.optional(
      v.union([
        v.pipe(v.strictObject({}), v.description("empty: the Pod's sidecar resources")),
        resources("this sidecar's requests and limits"),
      ]),
    ),
  });

/**
 * nvmf_tgt reactor mask as the agent's DISTORT_SPDK_CORE_MASK takes it: 0x-prefixed hex selecting
 * at least one and at most MAX_LCORES cores (lib/spdk/core-mask.ts refuses anything else).
 */
const CORE_MASK = new RegExp(`^0x0*[1-9a-fA-F][0-9a-fA-F]{0,${MAX_LCORES / 4 - 1}}$`);

// ---- the values ------------------------------------------------------------------------------

const LogLevel = v.picklist(["debug", "info", "warn", "error"]);

// The qos.* parameters of csi/controller/qos-parameters.ts, as numbers (rendered as strings).
const QosSchema = v.pipe(
  v.strictObject({
    rwIops: v.optional(
      v.pipe(
        int(0, MAX_QOS_IOPS),
        v.multipleOf(QOS_IOPS_UNIT),
        v.description("read+write IOPS; 0 unlimited"),
      ),
    ),
    rwMBps: v.optional(v.pipe(int(0, MAX_QOS_MBPS), v.description("read+write MiB/s; 0 unlimited"))),
    rMBps: v.optional(v.pipe(int(0, MAX_QOS_MBPS), v.description("read MiB/s; 0 unlimited"))),
    wMBps: v.optional(v.pipe(int(0, MAX_QOS_MBPS), v.description("write MiB/s; 0 unlimited"))),
  }),
  v.description("SPDK bdev QoS limits (spdk backend only)"),
);

const VolumeAttributesClassSchema = v.strictObject({
  name: name("VolumeAttributesClass name"),
  qos: QosSchema,
});

// csi/controller/parameters.ts refuses a volume manager that belongs to the other backend.
const MANAGER_BACKEND = { "spdk-lvol": "spdk", parted: "kernel" } as const;

const StorageClassSchema = v.pipe(
  v.strictObject({
    name: name("StorageClass name"),
    isDefault: v.pipe(v.boolean(), v.description("mark as the cluster's default StorageClass")),
    backend: BackendSchema,
    volumeManager: VolumeManagerSchema,
    transport: TransportSchema,
    fsType: v.picklist(SUPPORTED_FS_TYPES),
    reclaimPolicy: v.picklist(["Delete", "Retain"]),
    volumeBindingMode: v.picklist(["WaitForFirstConsumer", "Immediate"]),
    allowVolumeExpansion: v.boolean(),
    thinProvisioning: v.optional(
      v.pipe(
        v.boolean(),
        v.description(
          "thin lvols (spdk backend): placement reserves against the drive's overcommit ratio (NVMeDeviceClaim spec.overcommitRatio)",
        ),
      ),
    ),
    portalPort: v.optional(port("NVMe-oF listener port for volumes of this class")),
    mkfsOptions: v.optional(
      v.pipe(
        v.string(),
        v.maxLength(1024),
        v.description("extra mkfs arguments for fsType, from an allow-list (lib/mkfs-options.ts)"),
      ),
    ),
    // Ranges of csi/context.ts's volume-context schema (nvme connect -l/-c/-F bounds).
    reconnect: v.optional(
      v.strictObject({
        ctrlLossTmo: v.optional(v.pipe(int(-1, 86400), v.description("seconds; -1 reconnects forever"))),
        reconnectDelay: v.optional(v.pipe(int(1, 3600), v.description("seconds between reconnects"))),
        fastIoFailTmo: v.optional(v.pipe(int(-1, 86400), v.description("seconds until queued I/O fails"))),
      }),
    ),
    qos: v.optional(QosSchema),
    dhchap: v.optional(
      v.strictObject({
        mode: v.pipe(
          v.picklist(["none", "unidirectional", "bidirectional"]),
          v.description("DH-HMAC-CHAP with keys generated per volume and host"),
        ),
        hash: v.optional(v.picklist(["sha256", "sha384", "sha512"])),
        dhgroup: v.optional(
          v.picklist(["null", "ffdhe2048", "ffdhe3072", "ffdhe4096", "ffdhe6144", "ffdhe8192"]),
        ),
      }),
    ),
    tls: v.optional(
      v.pipe(
        v.picklist(["required", "none"]),
        v.description("NVMe/TCP TLS with a PSK generated per volume and host (transport tcp, backend spdk)"),
      ),
    ),
    dhchapSecret: v.optional(
      v.strictObject({
        name: name("Secret (in the release namespace) holding the DH-HMAC-CHAP key"),
        key: v.pipe(v.string(), v.regex(/^[-._a-zA-Z0-9]+$/), v.maxLength(253), v.description("data key")),
      }),
    ),
  }),
  v.check(
    (sc) => sc.volumeManager === "partition" || MANAGER_BACKEND[sc.volumeManager] === sc.backend,
    "volumeManager spdk-lvol needs backend spdk, parted needs kernel",
  ),
  v.metadata({
    jsonSchema: {
      allOf: Object.entries(MANAGER_BACKEND).map(([manager, backend]) => ({
        if: { properties: { volumeManager: { const: manager } }, required: ["volumeManager"] },
        // biome-ignore lint/suspicious/noThenProperty: JSON Schema's if/then keyword; never awaited.
        then: { properties: { backend: { const: backend } } },
      })),
    },
  }),
  // csi/controller/parameters.ts refuses thin volumes on the kernel backend.
  v.check(
    (sc) => sc.thinProvisioning !== true || sc.backend === "spdk",
    "thinProvisioning needs backend spdk",
  ),
  v.metadata({
    jsonSchema: {
      if: { properties: { thinProvisioning: { const: true } }, required: ["thinProvisioning"] },
      // biome-ignore lint/suspicious/noThenProperty: JSON Schema's if/then keyword; never awaited.
      then: { properties: { backend: { const: "spdk" } } },
    },
  }),
);

/** The agent section's values, but for variants (each variant may replace any of them). */
const AGENT_ENTRIES = {
  nodeSelector: stringMap("selects the storage nodes"),
  tolerations: anyList("agent Pod tolerations"),
  backends: v.pipe(v.array(BackendSchema), v.minLength(1)),
  spdk: v.strictObject({
    nvmfTgt: text("nvmf_tgt the agent starts; empty adopts a running one"),
    coreMask: v.pipe(v.string(), v.regex(CORE_MASK), v.description("nvmf_tgt reactor mask, e.g. 0x3")),
    hugepages: v.strictObject({
      pageSize: v.picklist(["2Mi", "1Gi"]),
      sizeMiB: v.pipe(
        v.union([v.literal(0), int(SPDK_MEM_SIZE_MB.min, SPDK_MEM_SIZE_MB.max)]),
        v.description("hugepage memory for nvmf_tgt (MiB); 0 requests no hugepages"),
      ),
    }),
    setupScript: text("SPDK setup script; empty when drives are already bound"),
    socketDir: absPath("host directory of the SPDK JSON-RPC socket"),
    separateTarget: v.strictObject({
      enabled: v.pipe(
        v.boolean(),
        v.description(
          "nvmf_tgt in a DaemonSet of its own (OnDelete) that the agent adopts; agent upgrades never stop it",
        ),
      ),
      extraArgs: v.pipe(
        v.array(v.string()),
        v.description("more nvmf_tgt arguments; never -m, -r or --wait-for-rpc"),
      ),
      extraEnv: anyList("more environment of the nvmf_tgt container"),
      extraVolumes: anyList("more volumes of the nvmf_tgt Pod"),
      extraVolumeMounts: anyList("more volume mounts of the nvmf_tgt container"),
      resources: resources("nvmf_tgt container"),
    }),
    targetWatchdog: v.strictObject({
      enabled: v.pipe(
        v.boolean(),
        v.description(
          "a target-watchdog container beside nvmf_tgt that fences the served replicated volumes' listeners when the agent stops renewing its lease",
        ),
      ),
      command: v.pipe(
        v.array(v.string()),
        v.minLength(1),
        v.description("the watchdog's command: the agent binary with --mode=target-watchdog"),
      ),
      pollMs: v.pipe(
        int(WATCHDOG_POLL_MS.min, WATCHDOG_POLL_MS.max),
        v.description("how often the lease is read (ms)"),
      ),
      resources: resources("target-watchdog container"),
    }),
    // Removed: thin provisioning is per StorageClass (storageClasses[].thinProvisioning). Still
    // accepted so templates/agent.yaml can name the replacement when an old values file sets it.
    thinLvols: v.optional(
      v.pipe(
        v.boolean(),
        v.description("removed; true fails the install: use storageClasses[].thinProvisioning"),
      ),
    ),
  }),
  portal: v.strictObject({
    // v.ip() is the very check agent/config.ts applies to DISTORT_PORTAL_ADDRESS.
    address: v.pipe(
      v.union([v.literal(""), v.pipe(v.string(), v.ip())]),
      v.description("portal IP; empty discovers the RDMA address"),
    ),
    // The same pattern the CIDR values above use; agent/config.ts also refuses host bits.
    networks: v.pipe(
      v.array(v.pipe(v.string(), v.regex(CIDR))),
      v.maxLength(MAX_PORTALS),
      v.description("storage networks (CIDRs): every address of the node in them is a portal"),
    ),
    port: port("NVMe-oF listener port"),
  }),
  devices: v.strictObject({
    allowed: text("drives the agent may use (serials or PCI addresses, comma-separated)"),
    excluded: text("drives the agent must leave alone"),
  }),
  // Bounds of agent/config.ts.
  reportPeriodMs: ms(1000, 3_600_000, "inventory report period"),
  metricsPeriodMs: ms(1000, 3_600_000, "node statistics period behind /metrics"),
  verifyPeriodMs: ms(1000, 3_600_000, "export re-verification period"),
  lostDriveReleaseAfterSeconds: wholeNumberIn(
    "agent.lostDriveReleaseAfterSeconds",
    1,
    LOST_RELEASE_MAX_SECONDS,
    "a deleted volume whose drive is lost this long is released, its room held as a leftover (s)",
  ),
  heartbeatPeriodMs: wholeNumberIn(
    "agent.heartbeatPeriodMs",
    HEARTBEAT_PERIOD_MS.min,
    HEARTBEAT_PERIOD_MS.max,
    "heartbeat period between reports (ms); a serving node counts as lost after failoverAfterSeconds without one",
  ),
  // agent/config.ts's DISTORT_REBUILD_MAX_BANDWIDTH_MB_SEC and DISTORT_REBUILDS_PER_NODE.
  rebuild: v.strictObject({
    maxBandwidthMBps: wholeNumberIn(
      "agent.rebuild.maxBandwidthMBps",
      0,
      REBUILD_MAX_BANDWIDTH_MB_SEC,
      "bandwidth cap of each rebuild onto a copy (MB/s); 0 unbounded",
    ),
    perNode: wholeNumberIn(
      "agent.rebuild.perNode",
      0,
      MAX_REBUILDS_PER_NODE,
      "most rebuilds running at once on the node; 0 starts none",
    ),
  }),
  healthPort: port("/healthz, /readyz and /metrics on the node (hostNetwork)"),
  stateDir: absPath("host directory for DH-HMAC-CHAP key files"),
  modulesDir: absPathOrNone("host directory of kernel modules; empty mounts none"),
  resources: resources("agent container"),
  extraContainers: anyList("containers beside the agent in its Pod (rendered through tpl)"),
  extraEnv: anyList("EnvVars appended to the agent container's"),
  extraVolumes: anyList("Volumes appended to the agent Pod's"),
  extraVolumeMounts: anyList("VolumeMounts appended to the agent container's"),
  command: strings("the agent container's command; empty keeps the image's entrypoint"),
  args: strings("the agent container's arguments"),
};
/** Names of agent variants: a suffix of the DaemonSet's name and a label value. */
const VARIANT_NAME = /^[a-z0-9]([-a-z0-9]{0,30}[a-z0-9])?$/;

export const ValuesSchema = v.strictObject({
  logLevel: LogLevel,
  images: v.strictObject({
    tag: text("tag of every image whose own tag is empty; empty means the chart's appVersion"),
    manager: image,
    agent: image,
    csi: image,
    dpu: image,
    pullPolicy: v.picklist(["Always", "IfNotPresent", "Never"]),
    pullSecrets: v.array(v.strictObject({ name: name("imagePullSecret name") })),
  }),
  sidecars: v.strictObject({
    pullPolicy: v.pipe(
      v.picklist(["", "Always", "IfNotPresent", "Never"]),
      v.description("imagePullPolicy of the sidecars that name an image; empty leaves Kubernetes' default"),
    ),
    provisioner: sidecar(false),
    attacher: sidecar(false),
    resizer: sidecar(false),
    snapshotter: sidecar(false),
    snapshotMetadata: sidecar(false),
    nodeDriverRegistrar: sidecar(true),
    livenessProbe: sidecar(true),
  }),
  priorityClass: v.strictObject({
    create: v.boolean(),
    name: v.pipe(
      v.string(),
      v.regex(/^$|^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$/),
      v.description("PriorityClass of every DISTORT Pod; empty (with create: false) uses none"),
    ),
    // User-defined PriorityClasses may not exceed one billion.
    value: int(0, 1_000_000_000),
  }),
  manager: v.strictObject({
    replicas: int(1, 9),
    // Bounds of manager/config.ts (DISTORT_LEASE_DURATION_MS >= 1000, ...).
    leaderElection: v.strictObject({
      enabled: v.boolean(),
      leaseName: name("Lease the replicas campaign for"),
      leaseDurationMs: ms(1000, Number.MAX_SAFE_INTEGER, "lease duration"),
      renewDeadlineMs: ms(500, Number.MAX_SAFE_INTEGER, "renew deadline"),
      retryPeriodMs: ms(100, Number.MAX_SAFE_INTEGER, "retry period"),
    }),
    workers: int(1, 256),
    placementWorkers: int(1, 256),
    heartbeatStalenessMs: ms(1000, Number.MAX_SAFE_INTEGER, "age after which a storage node is stale"),
    spreadPolicy: v.picklist(["most-free-device", "least-loaded-node"]),
    thinLvstoreFullPercent: v.pipe(
      int(1, 100),
      v.description("lvstore fullness (percent) above which new thin volumes are not placed on a drive"),
    ),
    // Bounds of manager/config.ts; maxMs >= initialMs is checked by the template (manager.yaml).
    placementBackoff: v.strictObject({
      initialMs: ms(10, Number.MAX_SAFE_INTEGER, "first retry delay of an unplaceable partition"),
      maxMs: ms(10, Number.MAX_SAFE_INTEGER, "largest retry delay"),
    }),
    resyncMs: ms(0, Number.MAX_SAFE_INTEGER, "full resync period; 0 disables"),
    rebuildsPerCluster: v.pipe(
      int(0, MAX_REBUILDS_PER_CLUSTER),
      v.description(
        "most copy rebuilds running at once in the cluster (slots the manager grants); 0: none starts",
      ),
    ),
    lostNodeReleaseAfterSeconds: wholeNumberIn(
      "manager.lostNodeReleaseAfterSeconds",
      1,
      LOST_RELEASE_MAX_SECONDS,
      "a deleted volume on a storage node silent this long is released, its room held as a leftover (s)",
    ),
    healthPort: port("/healthz, /readyz and /metrics"),
    podDisruptionBudget: v.strictObject({ enabled: v.boolean(), maxUnavailable: int(1, 9) }),
    resources: resources("manager container"),
    nodeSelector: stringMap("manager Pod nodeSelector"),
    tolerations: anyList("manager Pod tolerations"),
    affinity: anyObject("manager Pod affinity"),
  }),
  agent: v.strictObject({
    ...AGENT_ENTRIES,
    variants: v.pipe(
      v.record(v.pipe(v.string(), v.regex(VARIANT_NAME)), v.partial(v.strictObject(AGENT_ENTRIES))),
      v.description("more agent DaemonSets: per key, the agent values with these replaced"),
    ),
  }),
  csi: v.strictObject({
    kubeletDir: absPath("kubelet root directory"),
    driver: v.strictObject({
      podInfoOnMount: v.boolean(),
      fsGroupPolicy: v.picklist(["File", "ReadWriteOnceWithFSType", "None"]),
    }),
    // Bounds of csi/config.ts.
    defaultTimeoutMs: ms(1000, 3_600_000, "wait budget of CSI calls without a deadline"),
    defaultVolumeBytes: v.pipe(
      int(4 * 1024 * 1024),
      v.multipleOf(4 * 1024 * 1024),
      v.description("size of a volume requested without capacity (a multiple of 4 MiB)"),
    ),
    shutdownGraceMs: ms(0, 600_000, "time in-flight calls get on SIGTERM"),
    controller: v.strictObject({
      replicas: int(1, 9),
      healthPort: port("distort-csi /healthz, /readyz and /metrics"),
      attacherImage: text("replaces the csi-attacher image (DPU clusters: an SVVolumeAttachment attacher)"),
      provisioner: v.strictObject({
        workerThreads: int(1, 1000),
        timeout: duration("CSI call timeout"),
        retryIntervalMax: duration("maximum retry backoff"),
        capacityPollInterval: duration("period of GetCapacity polls behind CSIStorageCapacity"),
      }),
      attacher: v.strictObject({
        workerThreads: int(1, 1000),
        timeout: duration("CSI call timeout"),
        retryIntervalMax: duration("maximum retry backoff"),
      }),
      resizer: v.strictObject({ workers: int(1, 1000), timeout: duration("CSI call timeout") }),
      snapshotter: v.strictObject({ workerThreads: int(1, 1000), timeout: duration("CSI call timeout") }),
      snapshotMetadata: v.strictObject({
        enabled: v.pipe(
          v.boolean(),
          v.description(
            "csi-snapshot-metadata, its Service, TLS Secret and SnapshotMetadataService (with snapshots.enabled)",
          ),
        ),
        port: port("csi-snapshot-metadata gRPC (TLS) port, of the container and its Service"),
        httpPort: port("csi-snapshot-metadata /health and /metrics"),
        audience: text("audience clients' tokens must carry; empty: the CSI driver name"),
        timeout: duration("timeout of the sidecar's calls to the driver"),
        maxStreamingDurationMin: v.pipe(
          int(1, 1440),
          v.description("longest one metadata stream may last (minutes)"),
        ),
        certValidityDays: v.pipe(
          int(1, 36500),
          v.description("validity of the generated CA and certificate (days)"),
        ),
        clusterDomain: name(
          "cluster DNS domain of the certificate's <service>.<namespace>.svc.<domain> name",
        ),
      }),
      kubeApiQps: int(1, 10000),
      kubeApiBurst: int(1, 10000),
      // Bounds of csi/config.ts.
      orphanGraceMs: ms(0, 86_400_000, "age at which an unclaimed, annotated partition is orphaned"),
      orphanSweepMs: ms(1000, 3_600_000, "orphan sweep period"),
      resources: v.strictObject({
        driver: resources("distort-csi container"),
        sidecar: resources("each sidecar container"),
      }),
      nodeSelector: stringMap("CSI controller nodeSelector"),
      tolerations: anyList("CSI controller tolerations"),
      affinity: anyObject("CSI controller affinity"),
    }),
    node: v.strictObject({
      image: v.strictObject({
        repository: text("node plugin image repository; empty means images.csi"),
        tag: text("its tag; empty means images.tag, else the chart's appVersion"),
      }),
      command: strings("replaces the node plugin image's entrypoint; empty keeps it"),
      extraArgs: strings("arguments appended to distort-csi's"),
      healthPort: port("distort-csi /healthz on the node (hostNetwork)"),
      stagingSweepMs: v.pipe(
        v.union([v.literal(0), int(1000, 3_600_000)]),
        v.description("period of the sweep for staged volumes kubelet forgot (ms); 0 turns it off"),
      ),
      livenessProbePort: port("livenessprobe sidecar on the node"),
      registrarHealthPort: port("node-driver-registrar /healthz on the node"),
      nvmeConfigDir: absPath("host directory of the node's hostnqn, mounted read-only at /etc/nvme"),
      modulesDir: absPathOrNone("host directory of kernel modules; empty mounts none"),
      resources: v.strictObject({
        driver: resources("distort-csi node container"),
        sidecar: resources("each sidecar container"),
      }),
      nodeSelector: stringMap("CSI node plugin nodeSelector"),
      tolerations: anyList("CSI node plugin tolerations"),
      extraVolumes: anyList("Volumes appended to the node plugin Pod's"),
      extraVolumeMounts: anyList("VolumeMounts appended to the distort-csi container's"),
    }),
  }),
  snapshots: v.strictObject({
    enabled: v.boolean(),
    volumeSnapshotClass: v.strictObject({
      name: name("VolumeSnapshotClass name"),
      deletionPolicy: v.picklist(["Delete", "Retain"]),
    }),
  }),
  storageClasses: v.array(StorageClassSchema),
  // Classes a claim may switch to (spec.volumeAttributesClassName); the resizer then calls
  // ControllerModifyVolume. Their limits apply to spdk-backend volumes only.
  volumeAttributesClasses: v.array(VolumeAttributesClassSchema),
  dpu: v.strictObject({
    enabled: v.boolean(),
    pluginName: v.pipe(v.string(), v.regex(DNS_LABEL), v.description("DPF plugin name (socket directory)")),
    nodeSelector: stringMap("selects the DPU nodes"),
    tolerations: anyList("dpu Pod tolerations"),
    pluginsDir: absPath("DPF plugin socket root on the DPU"),
    snapSocketDir: absPath("directory of DOCA SNAP's JSON-RPC socket"),
    snapSocketName: v.pipe(v.string(), v.regex(/^[^/]+$/)),
    healthPort: port("/healthz, /readyz and /metrics (hostNetwork)"),
    registrarHealthPort: port("node-driver-registrar /healthz beside the plugin"),
    nvmeConfigDir: absPath("host directory of the DPU's hostnqn, mounted read-only at /etc/nvme"),
    resources: resources("dpu container"),
  }),
  dpuCluster: v.strictObject({
    enabled: v.boolean(),
    storageVendor: v.strictObject({
      apiVersion: v.pipe(v.string(), v.regex(/^[a-z0-9.-]+\/v[0-9a-z]+$/)),
      name: name("StorageVendor name"),
      namespace: v.pipe(
        v.string(),
        v.regex(/^$|^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/),
        v.description("namespace of the StorageVendor; empty means the release namespace"),
      ),
      storageClassName: name("the StorageClass DPF provisions through"),
    }),
  }),
  metrics: v.strictObject({
    serviceMonitor: v.strictObject({
      enabled: v.boolean(),
      interval: duration("scrape interval"),
      labels: stringMap("labels a Prometheus operator selects ServiceMonitors by"),
    }),
    prometheusRule: v.strictObject({
      enabled: v.boolean(),
      labels: stringMap("labels a Prometheus operator selects PrometheusRules by"),
      thresholds: v.strictObject({
        lvstoreFullPercent: v.pipe(
          v.number(),
          v.minValue(1),
          v.maxValue(100),
          v.description("lvstore fullness alert (%)"),
        ),
        ioLatencySeconds: v.pipe(
          v.number(),
          v.minValue(0.0001),
          v.description("mean volume I/O latency alert (s)"),
        ),
        attachmentStuckSeconds: v.pipe(int(1), v.description("attachment not ready alert (s)")),
        targetFailures15m: v.pipe(int(1), v.description("nvmf_tgt losses in 15 minutes that alert")),
        statsStaleSeconds: v.pipe(int(1), v.description("SPDK statistics age that alerts (s)")),
      }),
    }),
    grafanaDashboard: v.strictObject({
      enabled: v.boolean(),
      namespace: v.pipe(
        v.string(),
        v.regex(/^$|^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/),
        v.description("ConfigMap namespace; empty: the release's"),
      ),
      labels: stringMap("extra labels of the dashboard ConfigMap"),
    }),
  }),
  networkPolicy: v.strictObject({
    enabled: v.boolean(),
    metricsFrom: anyList("NetworkPolicyPeers allowed to reach the metrics ports"),
    snapshotMetadataFrom: anyList(
      "NetworkPolicyPeers allowed to reach the snapshot metadata port; empty: any source",
    ),
    portal: v.pipe(
      v.strictObject({
        enabled: v.pipe(
          v.boolean(),
          v.description(
            "ClusterNetworkPolicies keeping every Pod off the portals and the agents' health port",
          ),
        ),
        networks: v.pipe(
          v.array(v.pipe(v.string(), v.regex(CIDR))),
          v.maxLength(25),
          v.description("CIDRs holding the portal addresses (the storage network, or the node IPs)"),
        ),
        exemptNamespaces: v.pipe(
          v.array(v.pipe(v.string(), v.regex(DNS_LABEL))),
          v.description("namespaces whose Pods may still reach the agents' health port (scrapers)"),
        ),
        priority: v.pipe(int(0, 1000), v.description("Admin-tier priority (lower is checked first)")),
      }),
      v.check(
        (p) => !p.enabled || p.networks.length > 0,
        "networkPolicy.portal.networks must list the portal CIDRs when networkPolicy.portal.enabled",
      ),
      v.metadata({
        jsonSchema: {
          if: { properties: { enabled: { const: true } }, required: ["enabled"] },
          // biome-ignore lint/suspicious/noThenProperty: JSON Schema's if/then keyword; never awaited.
          then: { properties: { networks: { minItems: 1 } } },
        },
      }),
    ),
  }),
  admissionPolicy: v.strictObject({
    enabled: v.pipe(
      v.boolean(),
      v.description("ValidatingAdmissionPolicy: only the manager may set or change partition placement"),
    ),
  }),
});

export type Values = v.InferOutput<typeof ValuesSchema>;

// ---- valibot -> JSON Schema ------------------------------------------------------------------

export type JsonSchema = { [key: string]: unknown };

interface Walkable {
  readonly kind: string;
  readonly type: string;
  readonly pipe?: readonly Walkable[];
  readonly [key: string]: unknown;
}

/** Raised for a construct helm's validator could not enforce the same way; names the path. */
export class ValuesSchemaError extends Error {
  override readonly name = "ValuesSchemaError";
}

/**
 * The schema at the root of `schema`'s pipes and every action on the way, innermost first: a pipe
 * whose first item is itself a pipe (port(), ms(), intRange() under a description) keeps the
 * inner pipe's integer, minimum and maximum, which an outer action of the same kind then narrows.
 */
export function flattenPipe(schema: Walkable): Walkable[] {
  const pipe = schema.pipe;
  if (!pipe || pipe.length === 0) return [schema];
  const [inner, ...actions] = pipe;
  // valibot's pipe() puts the schema it was given first, itself maybe piped.
  if (inner === undefined || inner === schema) return [schema, ...actions];
  return [...flattenPipe(inner), ...actions];
}

function convert(schema: Walkable, path: string): JsonSchema {
  const [base, ...actions] = flattenPipe(schema);
  if (base?.kind !== "schema") throw new ValuesSchemaError(`${path}: not a schema`);
  let out: JsonSchema;
  switch (base.type) {
    case "string":
    case "number":
    case "boolean":
      out = { type: base.type };
      break;
    case "unknown":
      out = {};
      break;
    case "picklist":
      out = { enum: [...(base.options as unknown[])] };
      break;
    case "literal":
      out = { const: base.literal };
      break;
    case "union":
      out = { anyOf: (base.options as Walkable[]).map((o, i) => convert(o, `${path}|${i}`)) };
      break;
    case "array":
      out = { type: "array", items: convert(base.item as Walkable, `${path}[]`) };
      break;
    case "record":
      out = { type: "object", additionalProperties: convert(base.value as Walkable, `${path}{}`) };
      break;
    case "object":
    case "strict_object": {
      const properties: Record<string, JsonSchema> = {};
      const required: string[] = [];
      for (const [key, entry] of Object.entries(base.entries as Record<string, Walkable>)) {
        if (entry.type === "optional") properties[key] = convert(entry.wrapped as Walkable, `${path}.${key}`);
        else {
          properties[key] = convert(entry, `${path}.${key}`);
          required.push(key);
        }
      }
      out = { type: "object", properties };
      if (required.length) out.required = required;
      // Strict: a misspelt key fails `helm install` instead of being silently ignored.
      if (base.type === "strict_object") out.additionalProperties = false;
      break;
    }
    default:
      throw new ValuesSchemaError(`${path}: valibot schema "${base.type}" has no JSON Schema mapping`);
  }
  for (const [i, a] of actions.entries()) {
    const req = a.requirement;
    switch (a.type) {
      case "ip":
        if (out.pattern !== undefined) throw new ValuesSchemaError(`${path}: two patterns in one pipe`);
        // valibot's own expression (agent/config.ts uses v.ip()); helm's validator is Go RE2,
        // which takes the case-insensitive group.
        out.pattern = `(?i:${v.IP_REGEX.source})`;
        break;
      case "check": {
        // A TS-only rule must be followed by its JSON Schema twin, or helm would not enforce it.
        const twin = actions[i + 1];
        if (
          twin?.type !== "metadata" ||
          !Object.hasOwn((twin.metadata as object | undefined) ?? {}, "jsonSchema")
        )
          throw new ValuesSchemaError(`${path}: check() must be followed by metadata({ jsonSchema })`);
        break;
      }
      case "metadata":
        Object.assign(out, (a.metadata as { jsonSchema?: JsonSchema }).jsonSchema ?? {});
        break;
      case "description":
        out.description = a.description;
        break;
      case "integer":
        out.type = "integer";
        break;
      // Every action of a (flattened) pipe applies, so a bound given twice keeps the narrower.
      case "min_value":
        narrow(out, "minimum", req as number, Math.max);
        break;
      case "max_value":
        if (req !== Number.MAX_SAFE_INTEGER) narrow(out, "maximum", req as number, Math.min);
        break;
      case "multiple_of":
        if (out.multipleOf !== undefined && out.multipleOf !== req)
          throw new ValuesSchemaError(`${path}: two multipleOf() have no single JSON Schema form`);
        out.multipleOf = req;
        break;
      case "min_length":
        narrow(out, out.type === "array" ? "minItems" : "minLength", req as number, Math.max);
        break;
      case "max_length":
        narrow(out, out.type === "array" ? "maxItems" : "maxLength", req as number, Math.min);
        break;
      case "regex": {
        const re = req as RegExp;
        if (re.flags !== "") throw new ValuesSchemaError(`${path}: regex flags have no JSON Schema form`);
        if (out.pattern !== undefined) throw new ValuesSchemaError(`${path}: two patterns in one pipe`);
        out.pattern = re.source;
        break;
      }
      default:
        throw new ValuesSchemaError(`${path}: valibot action "${a.type}" has no JSON Schema mapping`);
    }
  }
  return out;
}

/** Sets bound `key` of `out` to `value`, or to `pick` of it and the bound already there. */
function narrow(out: JsonSchema, key: string, value: number, pick: (a: number, b: number) => number): void {
  const have = out[key];
  out[key] = typeof have === "number" ? pick(have, value) : value;
}

/**
 * The JSON Schema of any valibot schema the chart's values may use, named `path` in errors.
 * Throws ValuesSchemaError for a construct it has no faithful mapping for. Pure.
 */
export function jsonSchemaOf(schema: v.GenericSchema, path = "value"): JsonSchema {
  return convert(schema as unknown as Walkable, path);
}

/** The JSON Schema of ValuesSchema. Pure and deterministic. */
export function valuesJsonSchema(): JsonSchema {
  return {
    $schema: "http://json-schema.org/draft-07/schema#",
    title: "DISTORT chart values (generated by scripts/gen-values-schema.ts; do not edit)",
    ...convert(ValuesSchema as unknown as Walkable, "values"),
  };
}

/** Formats JSON the way the repository's Biome configuration does, so lint and drift agree. */
function biomeFormat(json: string, pathInRepo: string): string {
  const p = Bun.spawnSync(
    [join(ROOT, "node_modules", ".bin", "biome"), "format", `--stdin-file-path=${pathInRepo}`],
    { cwd: ROOT, stdin: Buffer.from(json), stdout: "pipe", stderr: "pipe" },
  );
  if (p.exitCode !== 0) throw new Error(`biome format failed: ${p.stderr.toString()}`);
  return p.stdout.toString();
}

/** The file's exact content. */
export function renderValuesSchema(): string {
  return biomeFormat(`${JSON.stringify(valuesJsonSchema(), null, 2)}\n`, relative(ROOT, VALUES_SCHEMA_PATH));
}

/** Writes values.schema.json to outPath when its content changed. Returns true if it wrote. */
export function genValuesSchema(outPath: string = VALUES_SCHEMA_PATH): boolean {
  const next = renderValuesSchema();
  let current: string | undefined;
  try {
    current = readFileSync(outPath, "utf8");
  } catch {
    current = undefined;
  }
  if (current === next) return false;
  writeFileSync(outPath, next);
  return true;
}

if (import.meta.main) {
  const wrote = genValuesSchema();
  console.log(`values.schema.json ${wrote ? "written" : "unchanged"} at ${VALUES_SCHEMA_PATH}`);
}
