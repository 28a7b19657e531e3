// The lab images end to end: built (or found in the cache) by buildImages, imported into a
// containerd of the test's own (own root, state and socket, stopped by PID), and run with ctr: the
// emulator in agent-lab answers spdk_get_version, the workload writes and verifies a pattern, and
// every image's binary runs in its container.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { connect } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Subprocess } from "bun";
import { IMAGE_NAMES, type ImageName } from "./image-plan.ts";
import { type BuiltImages, buildImages, importArchive, type LabImage } from "./images.ts";
import { eventually } from "./test-support.ts";
import { SIDECAR_VERSIONS } from "./tools.ts";

const dir = mkdtempSync(join(tmpdir(), "distort-images-"));
const sock = join(dir, "containerd.sock");
let containerd: Subprocess | undefined;
let built: BuiltImages;

async function ctr(...args: string[]): Promise<{ code: number; out: string }> {
  const p = Bun.spawn(["ctr", "--address", sock, "-n", "k8s.io", ...args], {
    stdout: "pipe",
    stderr: "pipe",
  });
  const [out, err, code] = await Promise.all([
    new Response(p.stdout).text(),
    new Response(p.stderr).text(),
    p.exited,
  ]);
  return { code, out: `${out}${err}` };
}

/** `ctr run --rm` flags that keep the client's FIFOs and the container's cgroup off fixed host paths. */
function runFlags(id: string): string[] {
  return ["--rm", "--fifo-dir", join(dir, "fifo"), "--cgroup", `/${base}-${id}`];
}
const base = dir.split("/").pop() as string;

async function refs(): Promise<string[]> {
  const r = await ctr("images", "ls", "-q");
  expect(r.code).toBe(0);
  return r.out.split("\n").filter((l) => l !== "");
}

function image(name: keyof BuiltImages["images"]): LabImage {
  const img = built.images[name];
  if (!img) throw new Error(`${name} was not built`);
  return img;
}

/** One JSON-RPC call on a unix socket; resolves with the parsed reply. */
function rpc(path: string, method: string): Promise<{ result?: { version?: string } }> {
  return new Promise((resolve, reject) => {
    const s = connect(path);
    let buf = "";
    s.on("error", reject);
    s.on("connect", () => s.write(JSON.stringify({ jsonrpc: "2.0", method, id: 1 })));
    s.on("data", (d) => {
      buf += d.toString();
      const nl = buf.indexOf("\n");
      if (nl >= 0) {
        s.destroy();
        resolve(JSON.parse(buf.slice(0, nl)));
      }
    });
  });
}

beforeAll(async () => {
  // Cold, this builds the base (mmdebstrap) and the images: minutes. Warm, a fraction of a second.
  built = await buildImages({
    progress: (l) => process.stderr.write(`[images] ${l}\n`),
  });
  writeFileSync(
    join(dir, "config.toml"),
    [
      "version = 2",
      `root = "${join(dir, "root")}"`,
      `state = "${join(dir, "state")}"`,
      // Only the image service and tasks are needed here, not the CRI.
      'disabled_plugins = ["io.containerd.grpc.v1.cri"]',
      "[grpc]",
      `  address = "${sock}"`,
      "[ttrpc]",
      `  address = "${sock}.ttrpc"`,
      "",
    ].join("\n"),
  );
  // containerd keeps some state at fixed paths (/run/containerd/{s,runc}): a private mount
  // namespace with its own /run keeps it off the host, and dies with the daemon.
  const start = `mount -t tmpfs tmpfs /run && exec containerd --config ${join(dir, "config.toml")}`;
  containerd = Bun.spawn(["unshare", "--mount", "--propagation", "private", "sh", "-c", start], {
    stdout: Bun.file(join(dir, "containerd.log")),
    stderr: Bun.file(join(dir, "containerd.log")),
  });
  await eventually(async () => (await ctr("version")).code === 0, 30_000, "containerd answering");
}, 900_000);

afterAll(async () => {
  if (containerd) {
    containerd.kill("SIGTERM");
    const exited = await Promise.race([
      containerd.exited.then(() => true),
      Bun.sleep(10_000).then(() => false),
    ]);
    if (!exited) containerd.kill("SIGKILL");
    await containerd.exited;
  }
  rmSync(dir, { recursive: true, force: true });
});

describe("lab images in containerd", () => {
  test("import names the image exactly distort.lab/<name>:<tag>; a second import finds it present", async () => {
    const agent = image("agent-lab");
    expect(agent.ref).toBe(`distort.lab/agent-lab:${built.tag}`);
    expect(await importArchive(sock, agent)).toBe("imported");
    expect(await refs()).toEqual([agent.ref]);
    // A warm node: the ref already points at the archive's manifest, so nothing is imported.
    expect(await importArchive(sock, agent)).toBe("present");
    expect(await refs()).toEqual([agent.ref]);
  }, 120_000);

  test("agent-lab's nvmf_tgt emulator answers spdk_get_version from inside its container", async () => {
    const agent = image("agent-lab");
    const shared = join(dir, "spdk");
    mkdirSync(join(shared, "data"), { recursive: true });
    const run = Bun.spawn(
      [
        "ctr",
        "--address",
        sock,
        "-n",
        "k8s.io",
        "run",
        ...runFlags("emulator"),
        "--mount",
        `type=bind,src=${shared},dst=/run/spdk,options=rbind:rw`,
        agent.ref,
        "emulator",
        "nvmf_tgt",
        "-m",
        "0x1",
        "-r",
        "/run/spdk/spdk.sock",
        "--sim-data-dir=/run/spdk/data",
      ],
      { stdout: "pipe", stderr: "pipe" },
    );
    try {
      const reply = await eventually(
        () => rpc(join(shared, "spdk.sock"), "spdk_get_version"),
        60_000,
        "emulator",
      );
      // The emulator's command line poses as v26.01 unless told otherwise (--sim-spdk-version):
      // the release whose TLS-PSK HKDF fix the agent requires before it serves TLS classes.
      expect(reply.result?.version).toMatch(/^SPDK v26\.01/);
    } finally {
      await ctr("task", "kill", "-s", "SIGTERM", "emulator");
      await run.exited;
    }
    expect(await run.exited).toBe(0);
  }, 120_000);

  test("a sidecar image carries its binary where the upstream image does", async () => {
    const prov = image("csi-provisioner");
    await importArchive(sock, prov);
    expect(await refs()).toContain(prov.ref);
    const r = await ctr(
      "run",
      ...runFlags("prov"),
      prov.ref,
      "provisioner-version",
      "/csi-provisioner",
      "--version",
    );
    expect(r.code).toBe(0);
    expect(r.out).toContain(SIDECAR_VERSIONS.provisioner);
  }, 120_000);

  test("the workload image writes and verifies a pattern on a mounted directory", async () => {
    const wl = image("workload");
    await importArchive(sock, wl);
    const vol = join(dir, "vol");
    mkdirSync(vol);
    const mount = `type=bind,src=${vol},dst=/vol,options=rbind:rw`;
    const args = ["--bytes=1Mi", "--seed=images-int", "--dir=/vol"];
    const w = await ctr(
      "run",
      ...runFlags("w"),
      "--mount",
      mount,
      wl.ref,
      "wl-write",
      "distort-workload",
      "write",
      ...args,
    );
    expect(w.code).toBe(0);
    const written = JSON.parse(w.out.trim().split("\n").at(-1) as string);
    expect(written).toMatchObject({ mode: "write", ok: true, bytes: 1 << 20 });
    const v = await ctr(
      "run",
      ...runFlags("v"),
      "--mount",
      mount,
      wl.ref,
      "wl-verify",
      "distort-workload",
      "verify",
      ...args,
    );
    expect(v.code).toBe(0);
    const verified = JSON.parse(v.out.trim().split("\n").at(-1) as string);
    expect(verified).toMatchObject({ mode: "verify", ok: true, sha256: written.sha256 });
    // busybox is there for ad-hoc checks of the same bytes.
    const sum = await ctr(
      "run",
      ...runFlags("s"),
      "--mount",
      mount,
      wl.ref,
      "wl-sum",
      "sha256sum",
      "/vol/distort-workload.bin",
    );
    expect(sum.out).toContain(written.sha256);
  }, 120_000);

  // Each binary reaches its own code (a usage or configuration error it prints), so the image has
  // the libraries and paths it needs; nothing is left running.
  const RUNS: Record<ImageName, { argv: string[]; env?: string[]; says: string }[]> = {
    manager: [
      { argv: ["distort-manager"], env: ["DISTORT_LEADER_ELECT=maybe"], says: "must be true or false" },
    ],
    agent: [{ argv: ["distort-agent"], says: "NODE_NAME" }],
    "agent-lab": [
      { argv: ["distort-agent"], says: "NODE_NAME" },
      { argv: ["nvmf_tgt", "--help"], says: "--sim-data-dir" },
    ],
    csi: [{ argv: ["distort-csi", "--bogus"], says: "unknown flag --bogus" }],
    "csi-lab": [
      { argv: ["distort-csi", "--bogus"], says: "unknown flag --bogus" },
      { argv: ["distort-csi-lab", "--mode=node"], says: "--sim-host-socket is required" },
    ],
    dpu: [
      {
        argv: ["distort-dpu"],
        env: ["DISTORT_DPU_FS_TYPE=bogus"],
        says: "DISTORT_DPU_FS_TYPE must be one of",
      },
    ],
    workload: [{ argv: ["distort-workload", "bogus"], says: "the first argument must be one of" }],
    "csi-provisioner": [{ argv: ["/csi-provisioner", "--version"], says: SIDECAR_VERSIONS.provisioner }],
    "csi-attacher": [{ argv: ["/csi-attacher", "--version"], says: SIDECAR_VERSIONS.attacher }],
    "csi-resizer": [{ argv: ["/csi-resizer", "--version"], says: SIDECAR_VERSIONS.resizer }],
    "csi-snapshotter": [{ argv: ["/csi-snapshotter", "--version"], says: SIDECAR_VERSIONS.snapshotter }],
    "snapshot-controller": [
      { argv: ["/snapshot-controller", "--version"], says: SIDECAR_VERSIONS.snapshotter },
    ],
    "csi-snapshot-metadata": [
      { argv: ["/csi-snapshot-metadata", "--version"], says: SIDECAR_VERSIONS.snapshotMetadata },
    ],
  };

  test("every image's binaries run in its container", async () => {
    const seen: Record<string, boolean> = {};
    for (const name of IMAGE_NAMES) {
      const img = image(name);
      await importArchive(sock, img);
      for (const [i, r] of RUNS[name].entries()) {
        const env = (r.env ?? []).flatMap((e) => ["--env", e]);
        const out = await ctr("run", ...runFlags(`${name}-${i}`), ...env, img.ref, `${name}-${i}`, ...r.argv);
        seen[`${name}: ${r.argv.join(" ")}`] = out.out.includes(r.says);
      }
    }
    expect(Object.values(seen).length).toBe(Object.values(RUNS).flat().length);
    expect(Object.entries(seen).filter(([, ok]) => !ok)).toEqual([]);
    expect((await refs()).sort()).toEqual(IMAGE_NAMES.map((n) => image(n).ref).sort());
  }, 600_000);
});
