// Flags over environment over defaults, and every refusal naming its flag.
import { expect, test } from "bun:test";
import { StorageError } from "../lib/errors.ts";
import { parseCsiConfig } from "./config.ts";

test("defaults, for a controller", () => {
  expect(parseCsiConfig(["--mode=controller"], {})).toEqual({
    socketPath: "/csi/csi.sock",
    mode: "controller",
    namespace: "distort-system",
    health: { host: "0.0.0.0", port: 9811 },
    logLevel: "info",
    defaultTimeoutMs: 60_000,
    defaultVolumeBytes: 1024 ** 3,
    shutdownGraceMs: 10_000,
    stateDir: "/var/lib/distort/csi",
    hostRoot: "/",
    keyDir: "/run/distort/csi-keys",
    topologyKeys: [],
    maxVolumesPerNode: 0,
    orphanGraceMs: 120_000,
    orphanSweepMs: 30_000,
    stagingSweepMs: 60_000,
    heartbeatStalenessMs: 90_000,
    nodeTools: ["nvme", "blkid", "mkfs.ext4", "mkfs.xfs", "mount", "umount"],
  });
  expect(
    parseCsiConfig(["--mode=controller", "--topology-keys=topology.kubernetes.io/zone, rack"], {})
      .topologyKeys,
  ).toEqual(["topology.kubernetes.io/zone", "rack"]);
});

test("kubelet-dir is taken without a trailing slash", () => {
  expect(parseCsiConfig(["--mode=controller", "--kubelet-dir=/var/lib/kubelet/"], {}).kubeletDir).toBe(
    "/var/lib/kubelet",
  );
});

test("flags win over the environment, which wins over defaults; both flag spellings work", () => {
  const c = parseCsiConfig(["--endpoint", "unix:///run/csi/x.sock", "--namespace=flagged", "--node-tools="], {
    CSI_ENDPOINT: "unix:///ignored.sock",
    DISTORT_NAMESPACE: "from-env",
    NODE_NAME: "worker-1",
    KUBECONFIG: "/etc/kube/config",
    DISTORT_HEALTH_PORT: "0",
    DISTORT_LOG_LEVEL: "debug",
  });
  expect(c).toMatchObject({
    socketPath: "/run/csi/x.sock",
    mode: "all",
    nodeId: "worker-1",
    kubeconfig: "/etc/kube/config",
    namespace: "flagged",
    health: { host: "0.0.0.0", port: 0 },
    logLevel: "debug",
    nodeTools: [],
  });
  expect(parseCsiConfig(["--mode=node", "--node-id=a"], { NODE_ID: "b", NODE_NAME: "c" }).nodeId).toBe("a");
  expect(parseCsiConfig(["--mode=node"], { NODE_ID: "b", NODE_NAME: "c" }).nodeId).toBe("b");
  expect(parseCsiConfig(["--endpoint=/abs/plain.sock", "--mode=controller"], {}).socketPath).toBe(
    "/abs/plain.sock",
  );
});

const refusals: [string, string[], Record<string, string>, string][] = [
  ["unknown flag", ["--frobnicate=1"], {}, "unknown flag --frobnicate"],
  ["positional argument", ["controller"], {}, "unexpected argument"],
  ["flag without value", ["--mode"], {}, "--mode needs a value"],
  ["bad mode", ["--mode=both"], {}, "--mode: mode must be controller, node or all"],
  ["relative endpoint", ["--mode=controller", "--endpoint=unix://csi.sock"], {}, "--endpoint"],
  ["tcp endpoint", ["--mode=controller", "--endpoint=tcp://1.2.3.4:5"], {}, "--endpoint"],
  ["node mode without node id", ["--mode=node"], {}, "--node-id (or NODE_ID) is required"],
  [
    "namespace not a label",
    ["--mode=controller", "--namespace=Distort"],
    {},
    "--namespace: namespace must be a DNS label",
  ],
  ["namespace too long for ids", ["--mode=controller", `--namespace=${"n".repeat(51)}`], {}, "128 bytes"],
  ["relative kubeconfig", ["--mode=controller", "--kubeconfig=kube.conf"], {}, "--kubeconfig"],
  ["bad port", ["--mode=controller", "--health-port=99999"], {}, "--health-port"],
  [
    "staging sweep too often",
    ["--mode=controller", "--staging-sweep-ms=500"],
    {},
    "--staging-sweep-ms: staging-sweep-ms must be 0 (off) or >= 1000",
  ],
  ["bad host", ["--mode=controller", "--health-host=localhost"], {}, "--health-host"],
  ["bad log level", ["--mode=controller"], { DISTORT_LOG_LEVEL: "loud" }, "--log-level"],
  ["timeout too short", ["--mode=controller", "--default-timeout-ms=10"], {}, "--default-timeout-ms"],
  ["relative state dir", ["--mode=controller", "--state-dir=state"], {}, "--state-dir"],
  ["relative host root", ["--mode=controller", "--host-root=host"], {}, "--host-root"],
  ["relative kubelet dir", ["--mode=controller", "--kubelet-dir=var/lib/kubelet"], {}, "--kubelet-dir"],
  ["kubelet dir at the root", ["--mode=controller", "--kubelet-dir=/"], {}, "--kubelet-dir"],
  ["bad topology key", ["--mode=controller", "--topology-keys=zone a"], {}, "--topology-keys"],
  ["negative volume limit", ["--mode=controller", "--max-volumes-per-node=-1"], {}, "--max-volumes-per-node"],
  ["orphan sweep too frequent", ["--mode=controller", "--orphan-sweep-ms=10"], {}, "--orphan-sweep-ms"],
  [
    "negative orphan grace",
    ["--mode=controller"],
    { DISTORT_CSI_ORPHAN_GRACE_MS: "-1" },
    "--orphan-grace-ms",
  ],
  [
    "volume size off the unit",
    ["--mode=controller", "--default-volume-bytes=5000000"],
    {},
    "--default-volume-bytes",
  ],
];
for (const [name, argv, env, says] of refusals) {
  test(`refuses: ${name}`, () => {
    let err: unknown;
    try {
      parseCsiConfig(argv, env);
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(StorageError);
    expect((err as StorageError).kind).toBe("invalid");
    expect((err as StorageError).message).toContain(says);
  });
}
