// The kubelet stand-in's pure parts: the names and paths kubelet derives for CSI volumes, the
// access-mode and capability mapping, quantities, the Node and Pod status it posts, which
// workload a Pod asks for, and the CLI flags.
import { describe, expect, test } from "bun:test";
import { VolumeCapability_AccessMode_Mode as Mode } from "../gen/csi/v1/csi_pb.ts";
import {
  expansionFailedStatus,
  expansionFinishedStatus,
  expansionStartedStatus,
  wantsNodeExpansion,
} from "./kubelet/expansion.ts";
import {
  attachmentName,
  podDir,
  publicationRecordDir,
  publishPath,
  sha256Hex,
  stagingPath,
  stagingRecordDir,
  uniqueVolumeName,
} from "./kubelet/naming.ts";
import { microTime, nodeLabels, nodeStatusBody, parseNodeIds } from "./kubelet/node-agent.ts";
import { type PodObject, type PodView, podStatus, workloadOf } from "./kubelet/pod-status.ts";
import { csiAccessMode, quantityBytes, volumeCapabilityOf, volumeModeOf } from "./kubelet/volume-spec.ts";
import { parseKubeletArgs } from "./kubelet.ts";

const DRIVER = "storage.distort.io";
const HANDLE = "distort-system/pvc-1234/0f0e0d0c-aaaa-bbbb-cccc-123456789abc";

describe("names and paths", () => {
  test("the VolumeAttachment name is csi-<sha256(handle + driver + node)>", () => {
    // Computed outside this code: printf '%s' "<handle>storage.distort.ioworker-1" | sha256sum
    expect(attachmentName(HANDLE, DRIVER, "worker-1")).toBe(
      "csi-61608c7aff43ded376a442ea4d9df72085a3f91c4e94fe54ccb16771ebc4acb7",
    );
    expect(attachmentName(HANDLE, DRIVER, "worker-2")).not.toBe(attachmentName(HANDLE, DRIVER, "worker-1"));
    expect(sha256Hex("")).toBe("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  });

  test("the unique volume name is kubernetes.io/csi/<driver>^<handle>", () => {
    expect(uniqueVolumeName(DRIVER, HANDLE)).toBe(`kubernetes.io/csi/storage.distort.io^${HANDLE}`);
  });

  test("filesystem volumes stage under the handle's sha256 and publish under the Pod", () => {
    const root = "/lab/w1/var/lib/kubelet";
    const o = { driver: DRIVER, volumeHandle: HANDLE, pvName: "pv-a", mode: "Filesystem" as const };
    // printf '%s' "<handle>" | sha256sum
    const sha = "d4bac248801756a6cb9fbd001760c7cfa596ad1d23bf2f733097594659bdeabd";
    expect(stagingPath(root, o)).toBe(
      `${root}/plugins/kubernetes.io/csi/storage.distort.io/${sha}/globalmount`,
    );
    expect(stagingRecordDir(root, o)).toBe(`${root}/plugins/kubernetes.io/csi/storage.distort.io/${sha}`);
    const pod = { podUID: "uid-1", pvName: "pv-a", mode: "Filesystem" as const };
    expect(publishPath(root, pod)).toBe(`${root}/pods/uid-1/volumes/kubernetes.io~csi/pv-a/mount`);
    expect(publicationRecordDir(root, pod)).toBe(`${root}/pods/uid-1/volumes/kubernetes.io~csi/pv-a`);
    expect(podDir(root, "uid-1")).toBe(`${root}/pods/uid-1`);
  });

  test("block volumes use the volumeDevices tree", () => {
    const root = "/k";
    const o = { driver: DRIVER, volumeHandle: HANDLE, pvName: "pv-b", mode: "Block" as const };
    expect(stagingPath(root, o)).toBe("/k/plugins/kubernetes.io/csi/volumeDevices/staging/pv-b");
    expect(stagingRecordDir(root, o)).toBe("/k/plugins/kubernetes.io/csi/volumeDevices/pv-b/data");
    const pod = { podUID: "uid-2", pvName: "pv-b", mode: "Block" as const };
    expect(publishPath(root, pod)).toBe("/k/plugins/kubernetes.io/csi/volumeDevices/publish/pv-b/uid-2");
    expect(publicationRecordDir(root, pod)).toBe("/k/pods/uid-2/volumeDevices/kubernetes.io~csi/pv-b");
  });
});

describe("volume spec", () => {
  test("access modes map as kubelet maps them, by the first mode", () => {
    expect(csiAccessMode(["ReadWriteOnce"])).toBe(Mode.SINGLE_NODE_WRITER);
    expect(csiAccessMode(["ReadWriteMany"])).toBe(Mode.MULTI_NODE_MULTI_WRITER);
    expect(csiAccessMode(["ReadOnlyMany"])).toBe(Mode.MULTI_NODE_READER_ONLY);
    expect(csiAccessMode(["ReadWriteOncePod"])).toBe(Mode.SINGLE_NODE_SINGLE_WRITER);
    expect(csiAccessMode(["ReadWriteOncePod", "ReadWriteMany"])).toBe(Mode.SINGLE_NODE_SINGLE_WRITER);
    expect(csiAccessMode(undefined)).toBe(Mode.SINGLE_NODE_WRITER);
    expect(csiAccessMode(["Sideways"])).toBe(Mode.UNKNOWN);
  });

  test("the capability is a mount with the PV's fsType (ext4 by default) and mount options, or block", () => {
    expect(
      volumeCapabilityOf({
        spec: { accessModes: ["ReadWriteOnce"], csi: { driver: DRIVER, volumeHandle: "h" } },
      }),
    ).toEqual({
      accessMode: { mode: Mode.SINGLE_NODE_WRITER },
      accessType: { case: "mount", value: { fsType: "ext4", mountFlags: [] } },
    });
    expect(
      volumeCapabilityOf({
        spec: {
          accessModes: ["ReadWriteOncePod"],
          mountOptions: ["noatime"],
          csi: { driver: DRIVER, volumeHandle: "h", fsType: "xfs" },
        },
      }),
    ).toEqual({
      accessMode: { mode: Mode.SINGLE_NODE_SINGLE_WRITER },
      accessType: { case: "mount", value: { fsType: "xfs", mountFlags: ["noatime"] } },
    });
    const block = {
      spec: { volumeMode: "Block", csi: { driver: DRIVER, volumeHandle: "h", fsType: "xfs" } },
    };
    expect(volumeModeOf(block)).toBe("Block");
    expect(volumeCapabilityOf(block)).toEqual({
      accessMode: { mode: Mode.SINGLE_NODE_WRITER },
      accessType: { case: "block", value: {} },
    });
  });

  test("quantities become whole bytes, rounded up", () => {
    expect(quantityBytes("1Gi")).toBe(1073741824n);
    expect(quantityBytes("256Mi")).toBe(268435456n);
    expect(quantityBytes("1.5Gi")).toBe(1610612736n);
    expect(quantityBytes("2G")).toBe(2000000000n);
    expect(quantityBytes("500k")).toBe(500000n);
    expect(quantityBytes("1536")).toBe(1536n);
    expect(quantityBytes("2e3")).toBe(2000n);
    expect(quantityBytes("1500m")).toBe(2n);
    expect(quantityBytes("0.1")).toBe(1n);
    expect(() => quantityBytes("-1Gi")).toThrow("not a size quantity");
    expect(() => quantityBytes("1GiB")).toThrow("not a size quantity");
  });
});

describe("node", () => {
  test("labels: hostname, os, arch, --label ones, then the driver's topology", () => {
    const labels = nodeLabels("w1", { role: "lab" }, { "topology.storage.distort.io/fabric": "lab" });
    expect(labels).toMatchObject({
      "kubernetes.io/hostname": "w1",
      "kubernetes.io/os": "linux",
      role: "lab",
      "topology.storage.distort.io/fabric": "lab",
    });
    expect(labels["kubernetes.io/arch"]).toBeString();
  });

  test("status: Ready with a fresh heartbeat, transition times kept while unchanged", () => {
    const nodeInfo = { kubeletVersion: "v1.36.1" } as never;
    const first = nodeStatusBody({
      nodeName: "w1",
      previous: undefined,
      nowMs: Date.parse("2030-01-01T00:00:00Z"),
      ephemeralStorage: "1000",
      volumesInUse: ["kubernetes.io/csi/d^h"],
      nodeInfo,
    }) as {
      conditions: { type: string; status: string; lastTransitionTime: string; lastHeartbeatTime: string }[];
    };
    const ready = first.conditions.find((c) => c.type === "Ready");
    expect(ready).toMatchObject({ status: "True", lastHeartbeatTime: "2030-01-01T00:00:00Z" });
    expect(first).toMatchObject({
      capacity: { cpu: "2", memory: "8Gi", pods: "110", "ephemeral-storage": "1000" },
      allocatable: { cpu: "2", memory: "8Gi", pods: "110" },
      volumesInUse: ["kubernetes.io/csi/d^h"],
      nodeInfo,
    });
    const later = nodeStatusBody({
      nodeName: "w1",
      previous: {
        conditions: first.conditions.map((c) => ({
          type: c.type,
          status: c.status,
          lastTransitionTime: new Date(c.lastTransitionTime),
        })),
      },
      nowMs: Date.parse("2030-01-01T00:00:40Z"),
      ephemeralStorage: "1000",
      volumesInUse: [],
      nodeInfo,
    }) as typeof first;
    const again = later.conditions.find((c) => c.type === "Ready");
    expect(again?.lastHeartbeatTime).toBe("2030-01-01T00:00:40Z");
    expect(again?.lastTransitionTime).toBe("2030-01-01T00:00:00Z");
  });

  test("the CSI node-id annotation and MicroTime", () => {
    expect(parseNodeIds('{"a":"n1","b":2}')).toEqual({ a: "n1" });
    expect(parseNodeIds("not json")).toEqual({});
    expect(parseNodeIds(undefined)).toEqual({});
    expect(microTime(Date.parse("2030-01-01T00:00:00.123Z"))).toBe("2030-01-01T00:00:00.123000Z");
  });
});

function pod(container: Record<string, unknown>, extra: Partial<PodObject["spec"]> = {}): PodObject {
  return {
    apiVersion: "v1",
    kind: "Pod",
    metadata: { name: "p", namespace: "ns", uid: "u1" },
    spec: { containers: [{ name: "c", ...container }], ...extra },
  };
}

describe("pods", () => {
  test("the workload comes from args (or command) and its first volumeMount or volumeDevice", () => {
    const w = workloadOf(
      pod({
        args: ["write", "--bytes=1Mi", "--seed=s"],
        volumeMounts: [{ name: "data", mountPath: "/data" }],
      }),
    );
    expect(w).toEqual({
      args: { mode: "write", bytes: 1024 * 1024, seed: "s", thenHold: false },
      volume: { name: "data", kind: "dir" },
    });
    expect(
      workloadOf(
        pod({
          command: ["verify", "--bytes=1", "--seed=s"],
          volumeDevices: [{ name: "b", devicePath: "/d" }],
        }),
      ).volume,
    ).toEqual({ name: "b", kind: "device" });
    expect(workloadOf(pod({ args: ["hold"] }))).toEqual({
      args: { mode: "hold", bytes: 0, seed: "", thenHold: false },
    });
  });

  test("what the stand-in cannot run is refused with the reason", () => {
    expect(() => workloadOf(pod({ args: ["sleep", "10"] }))).toThrow("container c: the first argument");
    expect(() => workloadOf(pod({ args: ["write", "--bytes=1", "--seed=s"] }))).toThrow(
      "needs a volumeMount",
    );
    expect(() =>
      workloadOf(
        pod({
          args: ["write", "--bytes=1", "--seed=s", "--dir=/x"],
          volumeMounts: [{ name: "d", mountPath: "/d" }],
        }),
      ),
    ).toThrow("come from the container's volumeMounts");
    expect(() => workloadOf(pod({ args: ["hold"] }, { initContainers: [{ name: "i" }] }))).toThrow(
      "init containers",
    );
    const two = pod({ args: ["hold"] });
    two.spec.containers.push({ name: "second" });
    expect(() => workloadOf(two)).toThrow("exactly one container");
  });

  const view = (v: Partial<PodView>): PodView => ({
    phase: "Pending",
    container: { kind: "waiting", reason: "ContainerCreating" },
    restartCount: 0,
    volumesReady: false,
    startTime: "2030-01-01T00:00:00Z",
    hostIP: "127.0.0.1",
    ...v,
  });

  test("status while waiting, running and after the workload ended", () => {
    const p = pod({ image: "img", args: ["hold"] });
    const pending = podStatus(
      p,
      view({ waitingMessage: "waiting for attach", message: "waiting for attach" }),
      "T0",
    ) as {
      phase: string;
      message: string;
      conditions: {
        type: string;
        status: string;
        reason?: string;
        message?: string;
        lastTransitionTime: string;
      }[];
      containerStatuses: Record<string, unknown>[];
    };
    expect(pending.phase).toBe("Pending");
    expect(pending.message).toBe("waiting for attach");
    expect(pending.conditions.find((c) => c.type === "PodReadyToStartContainers")).toMatchObject({
      status: "False",
      reason: "VolumesNotReady",
      message: "waiting for attach",
    });
    expect(pending.containerStatuses[0]).toMatchObject({
      name: "c",
      ready: false,
      state: { waiting: { reason: "ContainerCreating" } },
    });

    p.status = { conditions: pending.conditions };
    const running = podStatus(
      p,
      view({ phase: "Running", volumesReady: true, container: { kind: "running", startedAt: "T1" } }),
      "T1",
    ) as typeof pending;
    expect(running.message).toBeNull();
    expect(running.conditions.find((c) => c.type === "Ready")).toMatchObject({
      status: "True",
      lastTransitionTime: "T1",
    });
    // Unchanged conditions keep their transition time.
    expect(running.conditions.find((c) => c.type === "Initialized")?.lastTransitionTime).toBe("T0");
    expect(running.containerStatuses[0]).toMatchObject({
      ready: true,
      started: true,
      state: { running: { startedAt: "T1" } },
    });

    const line = '{"mode":"write","bytes":1,"sha256":"ab","ok":true}';
    const done = podStatus(
      p,
      view({
        phase: "Succeeded",
        volumesReady: true,
        message: line,
        container: {
          kind: "terminated",
          exitCode: 0,
          reason: "Completed",
          message: line,
          startedAt: "T1",
          finishedAt: "T2",
        },
      }),
      "T2",
    ) as typeof pending;
    expect(done.phase).toBe("Succeeded");
    expect(done.message).toBe(line);
    expect(done.containerStatuses[0]).toMatchObject({
      ready: false,
      state: { terminated: { exitCode: 0, reason: "Completed", message: line } },
    });
    expect(done.conditions.find((c) => c.type === "Ready")).toMatchObject({
      status: "False",
      reason: "PodCompleted",
    });
  });
});

describe("online expansion", () => {
  const claim = (status: Record<string, unknown>) => ({ status }) as never;

  test("the node expands a claim whose resize waits for it", () => {
    expect(wantsNodeExpansion(claim({ allocatedResourceStatuses: { storage: "NodeResizePending" } }))).toBe(
      true,
    );
    expect(
      wantsNodeExpansion(claim({ allocatedResourceStatuses: { storage: "NodeResizeInProgress" } })),
    ).toBe(true);
    expect(
      wantsNodeExpansion(claim({ allocatedResourceStatuses: { storage: "ControllerResizeInProgress" } })),
    ).toBe(false);
    expect(
      wantsNodeExpansion(claim({ allocatedResourceStatuses: { storage: "NodeResizeInfeasible" } })),
    ).toBe(false);
    const legacy = { conditions: [{ type: "FileSystemResizePending", status: "True" }] };
    expect(wantsNodeExpansion(claim(legacy))).toBe(true);
    expect(
      wantsNodeExpansion(
        claim({ ...legacy, allocatedResourceStatuses: { storage: "NodeResizeInfeasible" } }),
      ),
    ).toBe(false);
    expect(wantsNodeExpansion(claim({}))).toBe(false);
  });

  test("status patches as kubelet writes them: in progress, finished, failed", () => {
    expect(expansionStartedStatus()).toEqual({
      allocatedResourceStatuses: { storage: "NodeResizeInProgress" },
    });
    const t = new Date("2030-01-01T00:00:00Z");
    const pvc = claim({
      capacity: { storage: "256Mi" },
      allocatedResourceStatuses: { storage: "NodeResizeInProgress" },
      conditions: [
        { type: "FileSystemResizePending", status: "True", lastTransitionTime: t },
        { type: "Resizing", status: "True" },
        { type: "ModifyingVolume", status: "True", reason: "x", lastTransitionTime: t },
      ],
    });
    expect(expansionFinishedStatus(pvc, "512Mi")).toEqual({
      capacity: { storage: "512Mi" },
      allocatedResourceStatuses: null,
      conditions: [
        { type: "ModifyingVolume", status: "True", reason: "x", lastTransitionTime: "2030-01-01T00:00:00Z" },
      ],
    });
    const withOther = claim({
      capacity: { storage: "1Gi" },
      allocatedResourceStatuses: {
        storage: "NodeResizeInProgress",
        "example.com/iops": "ControllerResizeInProgress",
      },
    });
    expect(expansionFinishedStatus(withOther, "2Gi")).toMatchObject({
      allocatedResourceStatuses: { storage: null },
    });
    expect(expansionFailedStatus(pvc, "NodeExpandVolume: INTERNAL: no", "T")).toEqual({
      conditions: [
        { type: "FileSystemResizePending", status: "True", lastTransitionTime: "2030-01-01T00:00:00Z" },
        { type: "Resizing", status: "True" },
        { type: "ModifyingVolume", status: "True", reason: "x", lastTransitionTime: "2030-01-01T00:00:00Z" },
        {
          type: "NodeResizeError",
          status: "True",
          lastTransitionTime: "T",
          message: "failed to expand pvc with NodeExpandVolume: INTERNAL: no",
        },
      ],
    });
  });
});

describe("command line", () => {
  test("flags, repeated labels and both flag spellings", () => {
    expect(
      parseKubeletArgs([
        "--kubeconfig=/k",
        "--node-name",
        "w1",
        "--csi-endpoint=unix:///run/csi.sock",
        "--root-dir=/r",
        "--label=a=1",
        "--label",
        "b=x=y",
      ]),
    ).toEqual({
      kubeconfig: "/k",
      nodeName: "w1",
      csiEndpoint: "unix:///run/csi.sock",
      rootDir: "/r",
      labels: { a: "1", b: "x=y" },
      logLevel: "info",
    });
  });

  test.each([
    [["--node-name=w", "--csi-endpoint=unix:///s", "--root-dir=/r"], "--kubeconfig is required"],
    [["--kubeconfig=/k", "--node-name=w", "--csi-endpoint=/s", "--root-dir=/r"], "unix:///"],
    [
      ["--kubeconfig=/k", "--node-name=w", "--csi-endpoint=unix:///s", "--root-dir=/r", "--label=x"],
      "key=value",
    ],
    [["--kubeconfig=/k", "--bogus=1"], "unknown argument"],
    [["--kubeconfig=/k", "--kubeconfig=/j"], "twice"],
    [["--kubeconfig"], "needs a value"],
  ])("%j is refused", (argv, why) => {
    expect(() => parseKubeletArgs(argv)).toThrow(why);
  });
});

test("the CLI exits 2 with the usage on bad flags", async () => {
  const p = Bun.spawn([process.execPath, `${import.meta.dir}/kubelet.ts`, "--node-name=w1"], {
    stdout: "pipe",
    stderr: "pipe",
  });
  const [code, err] = await Promise.all([p.exited, new Response(p.stderr).text()]);
  expect(code).toBe(2);
  expect(err).toContain("--kubeconfig is required");
  expect(err).toContain("usage: bun lab/kubelet.ts");
});
