// The DPU plugin's environment: defaults that follow DPF's directory layout, overrides, and a
// clear refusal naming each bad variable.
import { expect, test } from "bun:test";
import { StorageError } from "../lib/errors.ts";
import { parseDpuConfig } from "./config.ts";

const HOST = "nqn.2014-08.org.nvmexpress:uuid:3b0c8a52-5d1e-4c7b-9a44-0d2f6e8b1c37";

test("defaults: DPF's plugin and provider directories, nvme-cli's host NQN file", () => {
  const c = parseDpuConfig({});
  expect(c.pluginName).toBe("distort");
  expect(c.socketPath).toBe("/var/lib/nvidia/storage/snap/plugins/distort/dpu.sock");
  expect(c.snapProvider).toBe("");
  expect(c.snapSocketPath).toBe("/var/lib/nvidia/storage/snap/providers/nvidia/snap.sock");
  expect(c.hostNqn).toBeUndefined();
  expect(c.hostNqnFile).toBe("/etc/nvme/hostnqn");
  expect(c.trtypes).toEqual({ tcp: "TCP", rdma: "RDMA" });
  expect(c.defaultFsType).toBe("ext4");
  expect(c.inCluster).toBe(false);
  expect(c.secretNamespace).toBe("distort-system");
  expect(c.health).toEqual({ host: "0.0.0.0", port: 9812 });
});

test("overrides, including a named SNAP provider and SNAP's accelerated TCP", () => {
  const c = parseDpuConfig({
    DISTORT_DPU_PLUGIN_NAME: "distort-a",
    DISTORT_DPU_SNAP_PROVIDER: "distort-snap",
    DISTORT_DPU_HOST_NQN: HOST,
    DISTORT_DPU_TCP_TRTYPE: "NVDA_TCP",
    POD_NAMESPACE: "storage",
    KUBERNETES_SERVICE_HOST: "10.0.0.1",
    NODE_NAME: "dpu-7",
    DISTORT_DPU_FS_TYPE: "xfs",
  });
  expect(c.socketPath).toBe("/var/lib/nvidia/storage/snap/plugins/distort-a/dpu.sock");
  expect(c.snapProvider).toBe("distort-snap");
  expect(c.snapSocketPath).toBe("/var/lib/nvidia/storage/snap/providers/distort-snap/snap.sock");
  expect(c.hostNqn).toBe(HOST);
  expect(c.trtypes.tcp).toBe("NVDA_TCP");
  expect(c.secretNamespace).toBe("storage");
  expect(c.inCluster).toBe(true);
  expect(c.nodeName).toBe("dpu-7");
  expect(c.defaultFsType).toBe("xfs");
});

test("bad values are refused, each by its variable", () => {
  const cases: [Record<string, string>, string][] = [
    [{ DISTORT_DPU_PLUGIN_NAME: "Bad Name" }, "DISTORT_DPU_PLUGIN_NAME"],
    [{ DISTORT_DPU_SOCKET: "relative.sock" }, "DISTORT_DPU_SOCKET must be an absolute path"],
    [{ DISTORT_DPU_SOCKET: `/${"x".repeat(120)}` }, "at most 107 bytes"],
    [{ DISTORT_DPU_SNAP_PROVIDER: "UPPER" }, "DISTORT_DPU_SNAP_PROVIDER"],
    [{ DISTORT_DPU_HOST_NQN: "nqn.2014-08.org.nvmexpress:uuid:not-a-uuid" }, "is not a UUID"],
    [{ DISTORT_DPU_STATE_DIR: "state" }, "DISTORT_DPU_STATE_DIR must be an absolute path"],
    [{ DISTORT_DPU_TCP_TRTYPE: "tcp over ip" }, "DISTORT_DPU_TCP_TRTYPE"],
    [{ DISTORT_DPU_FS_TYPE: "btrfs" }, "DISTORT_DPU_FS_TYPE"],
    [{ DISTORT_HEALTH_PORT: "70000" }, "DISTORT_HEALTH_PORT must be <= 65535"],
    [{ DISTORT_DPU_SNAP_TIMEOUT_MS: "fast" }, "DISTORT_DPU_SNAP_TIMEOUT_MS must be a whole number"],
    [{ DISTORT_LOG_LEVEL: "trace" }, "DISTORT_LOG_LEVEL"],
    [{ DISTORT_DPU_PLUGIN_NAME: "p".repeat(63) }, "longer than 107 bytes"],
  ];
  for (const [env, message] of cases) {
    let err: unknown;
    try {
      parseDpuConfig(env);
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(StorageError);
    expect((err as StorageError).kind).toBe("invalid");
    expect((err as Error).message).toContain(message);
  }
});
