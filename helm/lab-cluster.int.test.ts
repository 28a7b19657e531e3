// The real-cluster lab's profile (examples/lab-cluster.yaml) as `helm template` renders it: every
// image is the lab's own and never pulled, the agent Pod adopts the emulated nvmf_tgt beside it
// over shared directories, the CSI node plugin is distort-csi-lab on the node's simulated NVMe host
// with DISTORT's registrar and liveness equivalents, the lab's timers reach the binaries, and the
// host paths agree with lab/cluster/storage-prep.ts. The production render keeps upstream images
// and the chart's own containers and mounts, and the new knobs refuse what they cannot render.
import { beforeAll, describe, expect, test } from "bun:test";
import { dirname } from "node:path";
import { parseAgentConfig } from "../agent/config.ts";
import { parseWatchdogConfig, TARGET_WATCHDOG_MODE } from "../agent/watchdog/main.ts";
import { parseCsiConfig } from "../csi/config.ts";
import { parseDpuConfig } from "../dpu/config.ts";
import { DPU_NODE_PATHS, DPU_ROLE_LABEL } from "../lab/cluster/dpu-node.ts";
import { ensureHelm } from "../lab/cluster/helm-tool.ts";
import { KERNEL_NODE_PATHS } from "../lab/cluster/kernel-node.ts";
import { STORAGE_NETWORKS } from "../lab/cluster/node-network.ts";
import { KERNEL_STORAGE_LABEL_VALUE, STORAGE_LABEL } from "../lab/cluster/real-lab.ts";
import { NODE_PATHS, storageLayout } from "../lab/cluster/storage-prep.ts";
import { splitSimArgs } from "../lab/csi-node.ts";
import { FABRIC_LABEL } from "../lab/harness/stack.ts";
import { parseArgs as parseNvmfTgtArgs } from "../lab/sim/spdk/nvmf-tgt.ts";
import { parseConfig as parseManagerConfig } from "../manager/config.ts";
import { CHART_DIR, type KubeDoc, type Profile, render, runHelm } from "./chart-support.ts";

const TAG = "0a1b2c3-dirty-4d5e6f";
const NODE_IP = "198.18.0.11";
const LAB: Profile = {
  name: "lab-cluster",
  files: ["examples/lab-cluster.yaml"],
  set: [],
  setString: [`images.tag=${TAG}`],
};

interface Mount {
  name: string;
  mountPath: string;
  readOnly?: boolean;
}
interface Container {
  name: string;
  image: string;
  imagePullPolicy?: string;
  command?: string[];
  args?: string[];
  env?: { name: string; value?: string; valueFrom?: { fieldRef?: { fieldPath: string } } }[];
  resources?: { requests?: Record<string, string>; limits?: Record<string, string> };
  volumeMounts?: Mount[];
}
interface Volume {
  name: string;
  hostPath?: { path: string; type?: string };
  emptyDir?: { medium?: string };
}
interface PodSpec {
  containers: Container[];
  initContainers?: Container[];
  volumes?: Volume[];
}

let helm: string;
let lab: KubeDoc[];
let prod: KubeDoc[];

const podSpec = (o: KubeDoc) => (o.spec as { template: { spec: PodSpec } }).template.spec;
const workload = (objs: KubeDoc[], kind: string, component: string) => {
  const o = objs.find(
    (x) => x.kind === kind && x.metadata.labels?.["app.kubernetes.io/component"] === component,
  );
  if (!o) throw new Error(`no ${kind} for ${component}`);
  return o;
};
const container = (spec: PodSpec, name: string) => {
  const c = spec.containers.find((x) => x.name === name);
  if (!c) throw new Error(`no container ${name}`);
  return c;
};
const workloads = (objs: KubeDoc[]) => objs.filter((o) => o.kind === "Deployment" || o.kind === "DaemonSet");
const allContainers = (spec: PodSpec) => [...(spec.initContainers ?? []), ...spec.containers];
/** Env as a running container sees it: values, and downward-API fields filled in as kubelet does. */
const envOf = (c: Container) =>
  Object.fromEntries(
    (c.env ?? []).map((e) => {
      const field = e.valueFrom?.fieldRef?.fieldPath;
      const filled =
        field === "status.hostIP" ? NODE_IP : field === "spec.nodeName" ? "storage-a" : undefined;
      return [e.name, e.value ?? filled ?? ""];
    }),
  );
const mountOf = (c: Container, volume: string) => c.volumeMounts?.find((m) => m.name === volume);
const hostPathOf = (spec: PodSpec, volume: string) => spec.volumes?.find((v) => v.name === volume)?.hostPath;

beforeAll(async () => {
  helm = await ensureHelm();
  lab = (await render(helm, LAB, "distort", "distort-system")).objects;
  prod = (await render(helm, { name: "default", files: [], set: [] }, "distort", "distort-system")).objects;
}, 600_000);

describe("lab-cluster.yaml", () => {
  test("every container runs a distort.lab image of the lab's tag, never pulled", () => {
    const seen = new Set<string>();
    for (const w of workloads(lab))
      for (const c of allContainers(podSpec(w))) {
        const at = `${w.metadata.name}/${c.name}`;
        expect({ at, image: c.image.replace(/^distort\.lab\/[a-z-]+:/, "<lab>:") }).toEqual({
          at,
          image: `<lab>:${TAG}`,
        });
        expect({ at, pull: c.imagePullPolicy }).toEqual({ at, pull: "Never" });
        seen.add(c.image.slice("distort.lab/".length, c.image.indexOf(":")));
      }
    expect([...seen].sort()).toEqual(
      [
        "agent-lab",
        "csi",
        "csi-attacher",
        "csi-lab",
        "csi-provisioner",
        "csi-resizer",
        "csi-snapshot-metadata",
        "csi-snapshotter",
        "dpu",
        "manager",
      ].sort(),
    );
  });

  test("the agent adopts the emulated nvmf_tgt of its own DaemonSet (OnDelete) over shared host directories", () => {
    const agentSet = workload(lab, "DaemonSet", "agent");
    const tgtSet = workload(lab, "DaemonSet", "nvmf-tgt");
    const spec = podSpec(agentSet);
    const tspec = podSpec(tgtSet);
    expect(spec.containers.map((c) => c.name)).toEqual(["agent"]);
    // The target watchdog beside the emulated nvmf_tgt, in the Pod that outlives the agent's.
    expect(tspec.containers.map((c) => c.name)).toEqual(["nvmf-tgt", "target-watchdog"]);
    // An agent rollout never replaces the target: only a deleted target Pod is.
    expect((tgtSet.spec as { updateStrategy: { type: string } }).updateStrategy.type).toBe("OnDelete");
    const nodes = (o: KubeDoc) =>
      (podSpec(o) as PodSpec & { nodeSelector?: Record<string, string> }).nodeSelector;
    expect(nodes(tgtSet)).toEqual(nodes(agentSet));
    const agent = container(spec, "agent");
    const tgt = container(tspec, "nvmf-tgt");
    const cfg = parseAgentConfig(envOf(agent));
    expect(cfg.backends).toEqual(["spdk"]);
    // Adopts, initialises and watches the external target; starts none, takes no DPDK memory,
    // binds no drivers.
    expect(cfg.nvmfTgtCommand).toEqual([]);
    expect(cfg.nvmfTgtExternal).toBe(true);
    expect(cfg.spdkMemSizeMb).toBeUndefined();
    expect(cfg.spdkSetup).toBe("");
    // Portals: the node's address on each of the lab's storage networks, the node IP's first.
    expect(cfg.portalAddresses).toBeUndefined();
    expect(cfg.portalNetworks?.map((n) => n.text)).toEqual([...STORAGE_NETWORKS]);
    const layout = storageLayout(NODE_PATHS.storage);
    expect(cfg.hostRoot).toBe(layout.hostRoot);
    expect(cfg.reportPeriodMs).toBe(2000);
    expect(cfg.verifyPeriodMs).toBe(5000);

    // The emulator's command line, as the emulator parses it: waiting
    // for the agent's framework_start_init, on the agent's socket and core mask.
    expect(tgt.image).toBe(agent.image);
    expect(tgt.command).toEqual(["/usr/local/bin/nvmf_tgt"]);
    const argv = tgt.args ?? [];
    expect(argv).toContain("--sim-fabric=tcp");
    // Listeners only on the addresses its node's netns has (both storage networks).
    expect(argv).toContain("--sim-host-addresses=auto");
    const parsed = parseNvmfTgtArgs(argv);
    if (parsed === "help") throw new Error("the emulator was asked for help");
    expect(parsed.waitForRpc).toBe(true);
    expect(parsed.socketPath).toBe(cfg.spdkSocket);
    expect(parsed.coreMask).toBe(cfg.coreMask);
    expect(parsed.dataDir).toBe(layout.dataDir);
    expect(parsed.drivesFile).toBe(layout.drivesFile);

    // Shared through the host: the socket directory, the storage directory (same path in both),
    // the key directory (read-only for the target).
    const socketDir = dirname(cfg.spdkSocket);
    for (const [c, ps] of [
      [agent, spec],
      [tgt, tspec],
    ] as const) {
      expect({ c: c.name, at: mountOf(c, "spdk-socket")?.mountPath }).toEqual({ c: c.name, at: socketDir });
      expect({ c: c.name, at: mountOf(c, "lab-storage")?.mountPath }).toEqual({
        c: c.name,
        at: NODE_PATHS.storage,
      });
      expect({ c: c.name, at: mountOf(c, "state")?.mountPath }).toEqual({
        c: c.name,
        at: dirname(cfg.keyDir),
      });
      expect({ c: c.name, socket: hostPathOf(ps, "spdk-socket")?.path }).toEqual({
        c: c.name,
        socket: socketDir,
      });
      expect({ c: c.name, storage: hostPathOf(ps, "lab-storage")?.path }).toEqual({
        c: c.name,
        storage: NODE_PATHS.storage,
      });
      expect({ c: c.name, state: hostPathOf(ps, "state")?.path }).toEqual({
        c: c.name,
        state: dirname(cfg.keyDir),
      });
    }
    expect(mountOf(tgt, "state")?.readOnly).toBe(true);

    // The watchdog: the agent binary of the same image in its watchdog mode, on the agent's
    // socket directory (lease, socket, fence record), unprivileged and without an API token.
    const dog = container(tspec, "target-watchdog");
    expect(dog.image).toBe(agent.image);
    expect(dog.command).toEqual(["/usr/local/bin/distort-agent", TARGET_WATCHDOG_MODE]);
    const dogCfg = parseWatchdogConfig(envOf(dog));
    expect(dogCfg.spdkSocket).toBe(cfg.spdkSocket);
    expect(dogCfg.node).toBe(cfg.nodeName);
    expect(dogCfg.pollMs).toBe(250);
    expect(mountOf(dog, "spdk-socket")?.mountPath).toBe(socketDir);
    expect(
      (dog as Container & { securityContext?: { privileged?: boolean } }).securityContext?.privileged,
    ).not.toBe(true);
    expect((tspec as PodSpec & { automountServiceAccountToken?: boolean }).automountServiceAccountToken).toBe(
      false,
    );

    // No hugepages and no modules directory, which the lab's nodes do not have.
    for (const ps of [spec, tspec]) {
      expect(ps.volumes?.some((v) => v.emptyDir?.medium?.startsWith("HugePages"))).toBe(false);
      expect(ps.volumes?.some((v) => v.hostPath?.path === "/lib/modules")).toBe(false);
    }
    for (const c of [agent, tgt, dog]) {
      const keys = [...Object.keys(c.resources?.requests ?? {}), ...Object.keys(c.resources?.limits ?? {})];
      expect({ c: c.name, huge: keys.filter((k) => k.startsWith("hugepages")) }).toEqual({
        c: c.name,
        huge: [],
      });
      expect({ c: c.name, limits: Object.keys(c.resources?.limits ?? {}).sort() }).toEqual({
        c: c.name,
        limits: ["cpu", "memory"],
      });
    }
  });

  test("the kernel node's agent: a variant DaemonSet on storage-node=kernel, the lab's kernel agent, no target container", () => {
    const agents = workloads(lab).filter(
      (o) => o.kind === "DaemonSet" && o.metadata.labels?.["app.kubernetes.io/component"] === "agent",
    );
    expect(agents.map((o) => o.metadata.name)).toEqual(["distort-agent", "distort-agent-kernel"]);
    const [main, kernel] = agents as [KubeDoc, KubeDoc];
    const selector = (o: KubeDoc) => podSpec(o) as PodSpec & { nodeSelector?: Record<string, string> };
    expect(selector(main).nodeSelector).toEqual({ [STORAGE_LABEL]: "true" });
    expect(selector(kernel).nodeSelector).toEqual({ [STORAGE_LABEL]: KERNEL_STORAGE_LABEL_VALUE });
    // Its own Pods: the variant's selector and labels carry its name.
    const sel = (kernel.spec as { selector: { matchLabels: Record<string, string> } }).selector.matchLabels;
    expect(sel["storage.distort.io/agent-variant"]).toBe("kernel");
    const spec = podSpec(kernel);
    expect(spec.containers.map((c) => c.name)).toEqual(["agent"]);
    const agent = container(spec, "agent");
    expect(agent.command).toEqual(["/usr/local/bin/distort-agent-kernel-lab"]);
    expect(agent.args).toEqual([
      `--sim-notice-socket=${KERNEL_NODE_PATHS.noticeSocket}`,
      `--sim-device-map=${KERNEL_NODE_PATHS.deviceMap}`,
    ]);
    const cfg = parseAgentConfig(envOf(agent));
    expect(cfg.backends).toEqual(["kernel"]);
    expect(cfg.hostRoot).toBe(KERNEL_NODE_PATHS.hostRoot);
    // The same networks; the kernel backend serves only the primary portal (no multipath on nvmet yet).
    expect(cfg.portalNetworks?.map((n) => n.text)).toEqual([...STORAGE_NETWORKS]);
    // No SPDK: no RPC socket volume; the node's storage directory (sim root, notice socket, device
    // map) and the host's /dev and /sys (the loop device and its partitions) are mounted.
    expect(spec.volumes?.some((v) => v.name === "spdk-socket")).toBe(false);
    expect(hostPathOf(spec, "lab-storage")?.path).toBe(NODE_PATHS.storage);
    expect(mountOf(agent, "lab-storage")?.mountPath).toBe(NODE_PATHS.storage);
    expect(hostPathOf(spec, "dev")?.path).toBe("/dev");
    expect(KERNEL_NODE_PATHS.hostRoot.startsWith(`${NODE_PATHS.storage}/`)).toBe(true);
  });

  test("the CSI node plugin: distort-csi-lab on the node's NVMe host, DISTORT's registrar and liveness", () => {
    const spec = podSpec(workload(lab, "DaemonSet", "csi-node"));
    const driver = container(spec, "distort-csi");
    expect(driver.image).toBe(`distort.lab/csi-lab:${TAG}`);
    expect(driver.command).toEqual(["/usr/local/bin/distort-csi-lab"]);
    const { csi, hostSocket } = splitSimArgs((driver.args ?? []).map((a) => a.replace("$(NODE_NAME)", "n")));
    expect(hostSocket).toBe(NODE_PATHS.nvmeHostSocket);
    const cfg = parseCsiConfig(csi, {});
    expect(cfg.mode).toBe("node");
    expect(cfg.topologyKeys).toEqual([FABRIC_LABEL]);
    expect(cfg.nodeTools).toContain("losetup");
    // The host daemon's socket directory is the node's, at the same path in the container.
    const hostDir = spec.volumes?.find((v) => v.hostPath?.path === NODE_PATHS.nvmeHostDir);
    expect(hostDir).toBeDefined();
    expect(mountOf(driver, hostDir?.name ?? "")?.mountPath).toBe(NODE_PATHS.nvmeHostDir);
    // The node's own host NQN, read-only at /etc/nvme.
    expect(hostPathOf(spec, "etc-nvme")?.path).toBe(NODE_PATHS.nvmeConfigDir);
    expect(mountOf(driver, "etc-nvme")).toEqual({ name: "etc-nvme", mountPath: "/etc/nvme", readOnly: true });
    expect(spec.volumes?.some((v) => v.hostPath?.path === "/lib/modules")).toBe(false);

    const registrar = container(spec, "node-driver-registrar");
    expect(registrar.image).toBe(`distort.lab/csi:${TAG}`);
    expect(registrar.command).toEqual(["/usr/local/bin/distort-csi", "--mode=registrar"]);
    expect(registrar.args).toContain(
      "--kubelet-registration-path=/var/lib/kubelet/plugins/storage.distort.io/csi.sock",
    );
    const liveness = container(spec, "liveness-probe");
    expect(liveness.image).toBe(`distort.lab/csi:${TAG}`);
    expect(liveness.command).toEqual(["/usr/local/bin/distort-csi", "--mode=liveness"]);
  });

  test("the CSI controller: the five upstream sidecars built here, DISTORT's liveness, short orphan timers", () => {
    const dep = workload(lab, "Deployment", "csi-controller");
    expect((dep.spec as { replicas: number }).replicas).toBe(1);
    const spec = podSpec(dep);
    expect(spec.containers.map((c) => c.name)).toEqual([
      "distort-csi",
      "csi-provisioner",
      "csi-attacher",
      "csi-resizer",
      "csi-snapshotter",
      "csi-snapshot-metadata",
      "liveness-probe",
    ]);
    for (const name of [
      "csi-provisioner",
      "csi-attacher",
      "csi-resizer",
      "csi-snapshotter",
      "csi-snapshot-metadata",
    ]) {
      const c = container(spec, name);
      expect({ name, image: c.image, command: c.command }).toEqual({
        name,
        image: `distort.lab/${name}:${TAG}`,
        command: undefined,
      });
    }
    expect(container(spec, "liveness-probe").command).toEqual([
      "/usr/local/bin/distort-csi",
      "--mode=liveness",
    ]);
    const cfg = parseCsiConfig(container(spec, "distort-csi").args ?? [], {});
    expect([cfg.orphanGraceMs, cfg.orphanSweepMs]).toEqual([5000, 2000]);
  });

  test("the DPU plugin on the DPU node only, where the CSI node plugin does not go; its sockets where lab/cluster/dpu-node.ts looks", () => {
    type Scheduling = PodSpec & {
      nodeSelector?: Record<string, string>;
      tolerations?: { key?: string; operator?: string; effect?: string }[];
    };
    const set = workload(lab, "DaemonSet", "dpu");
    const spec = podSpec(set) as Scheduling;
    expect(spec.nodeSelector).toEqual({ [DPU_ROLE_LABEL]: "" });
    expect(spec.tolerations).toContainEqual({
      key: DPU_ROLE_LABEL,
      operator: "Exists",
      effect: "NoSchedule",
    });
    // The CSI node DaemonSet tolerates nothing, so the DPU's NoSchedule taint keeps it off: the
    // DPU's registrar registers storage.distort.io there.
    const node = podSpec(workload(lab, "DaemonSet", "csi-node")) as Scheduling;
    expect(node.tolerations ?? []).toEqual([]);
    const dpu = container(spec, "dpu");
    expect(dpu.image).toBe(`distort.lab/dpu:${TAG}`);
    const cfg = parseDpuConfig(envOf(dpu));
    expect(cfg.socketPath).toBe(DPU_NODE_PATHS.pluginSocket);
    expect(cfg.snapSocketPath).toBe(DPU_NODE_PATHS.snapSocket);
    // The DPU's host NQN is its node's own file, as the CSI node plugin's is.
    expect(hostPathOf(spec, "etc-nvme")?.path).toBe(NODE_PATHS.nvmeConfigDir);
    expect(mountOf(dpu, "etc-nvme")?.mountPath).toBe("/etc/nvme");
    expect(container(spec, "node-driver-registrar").command).toEqual([
      "/usr/local/bin/distort-csi",
      "--mode=registrar",
    ]);
  });

  test("two managers with the lab's short timers; snapshots and the lab's classes", async () => {
    const dep = workload(lab, "Deployment", "manager");
    expect((dep.spec as { replicas: number }).replicas).toBe(2);
    const cfg = parseManagerConfig(
      { ...envOf(container(podSpec(dep), "manager")), POD_NAME: "m-0" },
      { hostname: "h", randomSuffix: "r" },
    );
    expect(cfg.leaderElection).toMatchObject({
      leaseDurationMs: 4000,
      renewDeadlineMs: 3000,
      retryPeriodMs: 500,
    });
    expect(cfg.placementBackoff).toEqual({ initialMs: 200, maxMs: 2000 });
    expect(cfg.stalenessMs).toBe(20000);
    expect(lab.filter((o) => o.kind === "VolumeSnapshotClass")).toHaveLength(1);
    // The lab's classes: SPDK lvols over TCP, one per binding mode, with fast_io_fail_tmo 60 s
    // (it holds I/O across a target Pod's restart here), and GPT partitions on the kernel node.
    const classes = lab.filter((o) => o.kind === "StorageClass") as unknown as {
      metadata: { name: string };
      volumeBindingMode: string;
      parameters: Record<string, string>;
    }[];
    expect(classes.map((c) => [c.metadata.name, c.volumeBindingMode])).toEqual([
      ["distort-lab", "WaitForFirstConsumer"],
      ["distort-lab-immediate", "Immediate"],
      ["distort-lab-kernel", "WaitForFirstConsumer"],
    ]);
    expect(classes.map((c) => c.parameters.backend)).toEqual(["spdk", "spdk", "kernel"]);
    for (const c of classes.filter((x) => x.parameters.backend === "spdk")) {
      expect(Object.entries(c.parameters).find(([k]) => /fast.?io.?fail/i.test(k))?.[1]).toBe("60");
    }
  });
});

describe("the production render", () => {
  test("upstream sidecar images with the image's own entrypoint and Kubernetes' pull policy", () => {
    for (const w of workloads(prod))
      for (const c of allContainers(podSpec(w))) {
        expect(c.image.startsWith("distort.lab/")).toBe(false);
        if (c.image.startsWith("registry.k8s.io/sig-storage/"))
          expect({ c: c.name, command: c.command, pull: c.imagePullPolicy }).toEqual({
            c: c.name,
            command: undefined,
            pull: undefined,
          });
        else
          expect({ c: c.name, image: c.image }).toEqual({
            c: c.name,
            image: expect.stringMatching(/^distort\/[a-z]+:0\.1\.0$/),
          });
      }
    const node = podSpec(workload(prod, "DaemonSet", "csi-node"));
    expect(container(node, "distort-csi").command).toBeUndefined();
    expect(container(node, "node-driver-registrar").image).toBe(
      "registry.k8s.io/sig-storage/csi-node-driver-registrar:v2.17.0",
    );
    expect(hostPathOf(node, "etc-nvme")?.path).toBe("/etc/nvme");
    expect(hostPathOf(node, "modules")?.path).toBe("/lib/modules");
  });

  test("the agent and the target watchdog in its Pod (nvmf_tgt embedded), with hugepages, the modules directory and nvmf_tgt's -s", () => {
    const spec = podSpec(workload(prod, "DaemonSet", "agent"));
    expect(spec.containers.map((c) => c.name)).toEqual(["agent", "target-watchdog"]);
    const agent = container(spec, "agent");
    // The watchdog: the agent's socket directory, no hugepages, and the Pod's API token shadowed.
    const dog = container(spec, "target-watchdog");
    expect(parseWatchdogConfig(envOf(dog)).spdkSocket).toBe(parseAgentConfig(envOf(agent)).spdkSocket);
    expect(JSON.stringify(dog.resources)).not.toContain("hugepages");
    expect(mountOf(dog, "no-api-token")?.mountPath).toBe("/var/run/secrets/kubernetes.io/serviceaccount");
    expect(spec.volumes?.find((v) => v.name === "no-api-token")?.emptyDir).toBeDefined();
    expect(agent.resources?.limits?.["hugepages-2Mi"]).toBe("2048Mi");
    expect(agent.resources?.requests?.["hugepages-2Mi"]).toBe("2048Mi");
    expect(parseAgentConfig(envOf(agent)).spdkMemSizeMb).toBe(2048);
    expect(spec.volumes?.find((v) => v.name === "hugepages")?.emptyDir?.medium).toBe("HugePages-2Mi");
    expect(hostPathOf(spec, "modules")?.path).toBe("/lib/modules");
  });
});

describe("the knobs", () => {
  const template = (...args: string[]) =>
    runHelm(helm, ["template", "distort", CHART_DIR, "--namespace", "distort-system", ...args]);
  const objectsOf = async (p: Profile) => (await render(helm, p, "distort", "distort-system")).objects;

  test("images.tag tags every DISTORT image whose own tag is empty; a per-image tag wins", async () => {
    const objs = await objectsOf({
      name: "tag",
      files: [],
      set: ["dpu.enabled=true"],
      setString: ["images.tag=abc1234", "images.dpu.tag=9.9", "sidecars.resizer.repository=example/resizer"],
    });
    const images = new Set(workloads(objs).flatMap((w) => allContainers(podSpec(w)).map((c) => c.image)));
    expect(images).toContain("distort/manager:abc1234");
    expect(images).toContain("distort/agent:abc1234");
    expect(images).toContain("distort/csi:abc1234");
    expect(images).toContain("distort/dpu:9.9");
    // A sidecar given by repository takes images.tag; one given by reference keeps its own.
    expect(images).toContain("example/resizer:abc1234");
    expect(images).toContain("registry.k8s.io/sig-storage/csi-provisioner:v6.4.0");
  });

  test("--set turns an all-digit tag into a number: the schema refuses it instead of rendering it", async () => {
    const r = await template("--set", "images.tag=1234567");
    expect(r.code).not.toBe(0);
    expect(r.stderr).toContain("/images/tag");
    const ok = await template("--set-string", "images.tag=1234567");
    expect(ok.code).toBe(0);
    expect(ok.stdout).toContain("image: distort/manager:1234567");
  });

  test("hugepages sizeMiB 0 with a supervised nvmf_tgt: no hugepages volume, resource or -s", async () => {
    const objs = await objectsOf({ name: "nohuge", files: [], set: ["agent.spdk.hugepages.sizeMiB=0"] });
    const spec = podSpec(workload(objs, "DaemonSet", "agent"));
    const agent = container(spec, "agent");
    expect(JSON.stringify(agent.resources)).not.toContain("hugepages");
    expect(spec.volumes?.some((v) => v.name === "hugepages")).toBe(false);
    expect(agent.volumeMounts?.some((m) => m.name === "hugepages")).toBe(false);
    const cfg = parseAgentConfig(envOf(agent));
    expect(cfg.spdkMemSizeMb).toBeUndefined();
    expect(cfg.nvmfTgtCommand).toEqual(["/usr/local/bin/nvmf_tgt"]);
    const r = await template("--set", "agent.spdk.hugepages.sizeMiB=100");
    expect(r.code).not.toBe(0);
  });

  test("targetWatchdog.enabled=false: no watchdog container (nor its token-shadowing volume) in either layout", async () => {
    for (const set of [[], ["agent.spdk.separateTarget.enabled=true"]]) {
      const objs = await objectsOf({
        name: "no-watchdog",
        files: [],
        set: ["agent.spdk.targetWatchdog.enabled=false", ...set],
      });
      for (const w of workloads(objs)) {
        const spec = podSpec(w);
        expect({
          w: w.metadata.name,
          dog: spec.containers.some((c) => c.name === "target-watchdog"),
        }).toEqual({
          w: w.metadata.name,
          dog: false,
        });
        expect(spec.volumes?.some((v) => v.name === "no-api-token") ?? false).toBe(false);
      }
    }
  });

  test("separateTarget: nvmf_tgt in an OnDelete DaemonSet with the hugepages and -s; the agent adopts it and holds none", async () => {
    const objs = await objectsOf({
      name: "separate",
      files: [],
      set: ["agent.spdk.separateTarget.enabled=true"],
    });
    const agentSpec = podSpec(workload(objs, "DaemonSet", "agent"));
    const tgtSet = workload(objs, "DaemonSet", "nvmf-tgt");
    const tspec = podSpec(tgtSet);
    expect(tgtSet.metadata.name).toBe("distort-agent-nvmf-tgt");
    expect((tgtSet.spec as { updateStrategy: { type: string } }).updateStrategy.type).toBe("OnDelete");
    const agent = container(agentSpec, "agent");
    const tgt = container(tspec, "nvmf-tgt");
    const cfg = parseAgentConfig(envOf(agent));
    expect([cfg.nvmfTgtExternal, cfg.nvmfTgtCommand, cfg.spdkMemSizeMb]).toEqual([true, [], undefined]);
    // The watchdog goes with nvmf_tgt, out of the agent's Pod.
    expect(agentSpec.containers.map((c) => c.name)).toEqual(["agent"]);
    expect(tspec.containers.map((c) => c.name)).toEqual(["nvmf-tgt", "target-watchdog"]);
    expect(parseWatchdogConfig(envOf(container(tspec, "target-watchdog"))).spdkSocket).toBe(cfg.spdkSocket);
    expect(JSON.stringify(agent.resources)).not.toContain("hugepages");
    expect(agentSpec.volumes?.some((v) => v.name === "hugepages")).toBe(false);
    // The target runs as the supervisor would have started it: mask, socket, --wait-for-rpc, -s.
    expect([...(tgt.command ?? []), ...(tgt.args ?? [])]).toEqual([
      "/usr/local/bin/nvmf_tgt",
      "-m",
      cfg.coreMask,
      "-r",
      cfg.spdkSocket,
      "--wait-for-rpc",
      "-s",
      "2048",
    ]);
    expect(tgt.resources?.limits?.["hugepages-2Mi"]).toBe("2048Mi");
    expect(tspec.volumes?.find((v) => v.name === "hugepages")?.emptyDir?.medium).toBe("HugePages-2Mi");
    expect(mountOf(tgt, "spdk-socket")?.mountPath).toBe(dirname(cfg.spdkSocket));
    expect(mountOf(tgt, "state")).toEqual({ name: "state", mountPath: dirname(cfg.keyDir), readOnly: true });
    // Off by default: no target DaemonSet, the agent starts nvmf_tgt itself.
    expect(
      workloads(prod).some((o) => o.metadata.labels?.["app.kubernetes.io/component"] === "nvmf-tgt"),
    ).toBe(false);
    const none = await template(
      "--set",
      "agent.spdk.separateTarget.enabled=true",
      "--set",
      "agent.spdk.nvmfTgt=",
    );
    expect(none.code).not.toBe(0);
    expect(none.stderr).toContain("separateTarget.enabled needs agent.spdk.nvmfTgt");
  });

  test("refuses a sidecar without image or repository, and a placement backoff the manager refuses", async () => {
    const r1 = await template("--set", "sidecars.attacher.image=");
    expect(r1.code).not.toBe(0);
    expect(r1.stderr).toContain("sidecars.attacher needs an image or a repository");
    // The DPU attacher override still stands in for an empty image.
    const r2 = await template(
      "--set",
      "sidecars.attacher.image=",
      "--set",
      "csi.controller.attacherImage=x/att:1",
    );
    expect(r2.code).toBe(0);
    const r3 = await template(
      "--set",
      "manager.placementBackoff.initialMs=5000,manager.placementBackoff.maxMs=1000",
    );
    expect(r3.code).not.toBe(0);
    expect(r3.stderr).toContain("manager.placementBackoff.maxMs");
  });

  test("agent.variants: one more DaemonSet per entry with its overrides; the main one unchanged", async () => {
    const objs = await objectsOf({
      name: "variants",
      files: [],
      set: ["agent.variants.nvmet.backends={kernel}", "agent.variants.nvmet.nodeSelector.tier=nvmet"],
    });
    const agents = workloads(objs).filter(
      (o) => o.metadata.labels?.["app.kubernetes.io/component"] === "agent",
    );
    expect(agents.map((o) => o.metadata.name)).toEqual(["distort-agent", "distort-agent-nvmet"]);
    expect(agents[0]).toEqual(workload(prod, "DaemonSet", "agent"));
    const spec = podSpec(agents[1] as KubeDoc) as PodSpec & { nodeSelector?: Record<string, string> };
    // Maps merge, lists are replaced.
    expect(spec.nodeSelector).toEqual({ "storage.distort.io/storage-node": "true", tier: "nvmet" });
    expect(parseAgentConfig(envOf(container(spec, "agent"))).backends).toEqual(["kernel"]);
    // The schema holds variants to the agent's own keys.
    const bad = await template("--set", "agent.variants.x.nvmfTgt=/bin/true");
    expect(bad.code).not.toBe(0);
  });

  test("extraContainers see chart values through tpl", async () => {
    const r = await template(
      "--set",
      "agent.extraContainers[0].name=side",
      "--set",
      "agent.extraContainers[0].image=x/{{ .Values.agent.spdk.coreMask }}",
    );
    expect(r.code).toBe(0);
    expect(r.stdout).toContain("image: x/0x1");
  });
});
