// The chart's CSI sidecar knobs, rendered by the real helm (no cluster needed): defaults keep
// upstream's images and entrypoints untouched; an empty nodeDriverRegistrar/livenessProbe image
// runs DISTORT's equivalent from the csi image with arguments its own parsers accept; command and
// resources overrides land on exactly their container; values the schema forbids are refused.
import { beforeAll, describe, expect, test } from "bun:test";
import { parseLivenessConfig, parseRegistrarConfig } from "../csi/sidecar/config.ts";
import { ensureHelm } from "../lab/cluster/helm-tool.ts";
import { DRIVER_NAME } from "../lib/volume-context.ts";
import { CHART_DIR, type KubeDoc, type Profile, render, runHelm } from "./chart-support.ts";

let helm: string;
beforeAll(async () => {
  helm = await ensureHelm();
}, 600_000);

interface Container {
  name: string;
  image: string;
  imagePullPolicy?: string;
  command?: string[];
  args?: string[];
  resources?: unknown;
  volumeMounts?: { name: string; mountPath: string }[];
}
interface PodSpec {
  containers: Container[];
  volumes: { name: string; hostPath?: { path: string } }[];
}

const SIDECARS = {
  "csi-controller": ["csi-provisioner", "csi-attacher", "csi-resizer", "csi-snapshotter", "liveness-probe"],
  "csi-node": ["node-driver-registrar", "liveness-probe"],
} as const;

async function pods(set: string[]): Promise<Record<keyof typeof SIDECARS, PodSpec>> {
  // Snapshots on, so csi-snapshotter renders too.
  const p: Profile = { name: "sidecars", files: [], set: ["snapshots.enabled=true", ...set] };
  const { objects } = await render(helm, p, "rel", "distort-system");
  const spec = (suffix: string) =>
    (
      (
        objects.find(
          (o) => o.metadata.name.endsWith(`-${suffix}`) && /Deployment|DaemonSet/.test(o.kind),
        ) as KubeDoc
      ).spec as { template: { spec: PodSpec } }
    ).template.spec;
  return { "csi-controller": spec("csi-controller"), "csi-node": spec("csi-node") };
}
const container = (pod: PodSpec, name: string) => pod.containers.find((c) => c.name === name) as Container;

const DISTORT_EQUIVALENTS = [
  "sidecars.nodeDriverRegistrar.image=",
  "sidecars.livenessProbe.image=",
  "images.csi.repository=distort.lab/csi",
  "images.csi.tag=abc123",
  "images.pullPolicy=Never",
];

describe("CSI sidecars in the chart", () => {
  test("defaults: upstream images, their own entrypoints, the Pod's sidecar resources, no --mode", async () => {
    const p = await pods([]);
    const want = {
      "csi-provisioner": "registry.k8s.io/sig-storage/csi-provisioner:",
      "csi-attacher": "registry.k8s.io/sig-storage/csi-attacher:",
      "csi-resizer": "registry.k8s.io/sig-storage/csi-resizer:",
      "csi-snapshotter": "registry.k8s.io/sig-storage/csi-snapshotter:",
      "liveness-probe": "registry.k8s.io/sig-storage/livenessprobe:",
      "node-driver-registrar": "registry.k8s.io/sig-storage/csi-node-driver-registrar:",
    } as Record<string, string>;
    const sidecarResources = {
      "csi-controller": {
        requests: { cpu: "10m", memory: "32Mi" },
        limits: { cpu: "500m", memory: "256Mi" },
      },
      "csi-node": { requests: { cpu: "5m", memory: "16Mi" }, limits: { cpu: "100m", memory: "64Mi" } },
    };
    for (const [pod, names] of Object.entries(SIDECARS) as [keyof typeof SIDECARS, readonly string[]][])
      for (const name of names) {
        const c = container(p[pod], name);
        expect({ at: `${pod}/${name}`, image: c.image.startsWith(want[name] as string) }).toEqual({
          at: `${pod}/${name}`,
          image: true,
        });
        expect(c.command).toBeUndefined();
        expect(c.imagePullPolicy).toBeUndefined();
        expect(c.resources).toEqual(sidecarResources[pod]);
        expect(c.args?.some((a) => a.startsWith("--mode"))).toBe(false);
      }
  });

  test("empty image: DISTORT's equivalents from the csi image, with arguments their parsers accept", async () => {
    const p = await pods(DISTORT_EQUIVALENTS);
    const reg = container(p["csi-node"], "node-driver-registrar");
    expect([reg.image, reg.imagePullPolicy, reg.command]).toEqual([
      "distort.lab/csi:abc123",
      "Never",
      undefined,
    ]);
    expect(reg.args?.[0]).toBe("--mode=registrar");
    const cfg = parseRegistrarConfig(reg.args ?? [], {});
    // kubelet dials the node path of the socket the distort-csi container serves at /csi/csi.sock.
    expect(cfg.kubeletRegistrationPath).toBe(`/var/lib/kubelet/plugins/${DRIVER_NAME}/csi.sock`);
    const pluginDir = p["csi-node"].volumes.find((v) => v.name === "plugin-dir")?.hostPath?.path;
    expect(`${pluginDir}/csi.sock`).toBe(cfg.kubeletRegistrationPath);
    expect(cfg.csiSocketPath).toBe("/csi/csi.sock");
    // The registration socket lands in kubelet's plugins_registry.
    const regMount = reg.volumeMounts?.find((m) => m.mountPath === cfg.registrationDir);
    expect(p["csi-node"].volumes.find((v) => v.name === regMount?.name)?.hostPath?.path).toBe(
      "/var/lib/kubelet/plugins_registry",
    );
    expect(cfg.http).toEqual({ host: "0.0.0.0", port: 9809 });

    for (const pod of ["csi-node", "csi-controller"] as const) {
      const l = container(p[pod], "liveness-probe");
      expect([l.image, l.imagePullPolicy, l.args?.[0]]).toEqual([
        "distort.lab/csi:abc123",
        "Never",
        "--mode=liveness",
      ]);
      const lc = parseLivenessConfig(l.args ?? [], {});
      // Both Pods serve it on 9808 (the node's csi.node.livenessProbePort default).
      expect([lc.csiSocketPath, lc.probeTimeoutMs, lc.http.port]).toEqual(["/csi/csi.sock", 3000, 9808]);
    }
    // The controller sidecars are untouched.
    expect(container(p["csi-controller"], "csi-provisioner").image).toStartWith("registry.k8s.io/");
  });

  test("command and resources overrides land on their container only; a command carries its own mode", async () => {
    const p = await pods([
      "sidecars.provisioner.command={/usr/local/bin/csi-provisioner}",
      "sidecars.snapshotter.command={/usr/local/bin/csi-snapshotter}",
      "sidecars.nodeDriverRegistrar.image=distort.lab/csi:abc123",
      "sidecars.nodeDriverRegistrar.command={/usr/local/bin/distort-csi,--mode=registrar}",
      "sidecars.livenessProbe.resources.requests.cpu=5m",
      "sidecars.livenessProbe.resources.requests.memory=64Mi",
      "sidecars.livenessProbe.resources.limits.cpu=500m",
      "sidecars.livenessProbe.resources.limits.memory=192Mi",
    ]);
    expect(container(p["csi-controller"], "csi-provisioner").command).toEqual([
      "/usr/local/bin/csi-provisioner",
    ]);
    expect(container(p["csi-controller"], "csi-snapshotter").command).toEqual([
      "/usr/local/bin/csi-snapshotter",
    ]);
    expect(container(p["csi-controller"], "csi-attacher").command).toBeUndefined();
    expect(container(p["csi-controller"], "csi-resizer").command).toBeUndefined();
    const reg = container(p["csi-node"], "node-driver-registrar");
    expect(reg.command).toEqual(["/usr/local/bin/distort-csi", "--mode=registrar"]);
    // The image is not empty, so the chart adds no --mode; the command's own is the only one.
    expect(reg.args?.[0]).toBe("--csi-address=/csi/csi.sock");
    expect(() =>
      parseRegistrarConfig([...(reg.command?.slice(1) ?? []), ...(reg.args ?? [])], {}),
    ).not.toThrow();
    const own = { requests: { cpu: "5m", memory: "64Mi" }, limits: { cpu: "500m", memory: "192Mi" } };
    expect(container(p["csi-node"], "liveness-probe").resources).toEqual(own);
    expect(container(p["csi-controller"], "liveness-probe").resources).toEqual(own);
    expect(container(p["csi-node"], "node-driver-registrar").resources).not.toEqual(own);
  });

  test("the attacher override (DPU clusters) still wins over sidecars.attacher.image, and keeps its command", async () => {
    const p = await pods([
      "csi.controller.attacherImage=example.com/svva-attacher:1",
      "sidecars.attacher.command={/attacher}",
    ]);
    const a = container(p["csi-controller"], "csi-attacher");
    expect([a.image, a.command]).toEqual(["example.com/svva-attacher:1", ["/attacher"]]);
  });

  test.each([
    // An image may be given as repository instead, so the template (not the schema) refuses neither.
    ["sidecars.provisioner.image=", "sidecars.provisioner needs an image or a repository"],
    ["sidecars.resizer.command[0]=", "/sidecars/resizer/command/0"],
    ["sidecars.livenessProbe.resources.limits.cpu=1", "/sidecars/livenessProbe/resources"],
    ["sidecars.attacher.entrypoint=x", "entrypoint"],
  ])("refuses %s", async (set, where) => {
    const r = await runHelm(helm, ["template", "x", CHART_DIR, "--set", set]);
    expect(r.code).not.toBe(0);
    expect(r.stderr).toContain(where);
  });
});
