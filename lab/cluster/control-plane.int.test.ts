// The lab control plane starts from the cached Go builds, serves a stamped kube-apiserver with
// token auth, and leaves no process or port behind: neither after stop() nor when its parent dies.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { existsSync, rmSync } from "node:fs";
import { join } from "node:path";
import { type ControlPlane, portIsFree, startControlPlane } from "./control-plane.ts";
import { KUBE_VERSION } from "./tools.ts";

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

let cp: ControlPlane;
beforeAll(async () => {
  cp = await startControlPlane({ controllerManager: true });
}, 300_000);
afterAll(async () => {
  await cp?.stop();
});

test("serves a version-stamped apiserver behind the CA and token in the kubeconfig", async () => {
  const res = await fetch(`${cp.server}/version`, {
    headers: { authorization: `Bearer ${cp.token}` },
    tls: { ca: cp.caPem },
  });
  expect(res.status).toBe(200);
  const body = (await res.json()) as { gitVersion: string; major: string; minor: string };
  expect(body.gitVersion).toBe(KUBE_VERSION);
  expect(body.major).toBe("1");
  const anon = await fetch(`${cp.server}/api/v1/namespaces`, { tls: { ca: cp.caPem } });
  expect([401, 403]).toContain(anon.status);
});

test("kubectl from the same build reads the cluster through the written kubeconfig", async () => {
  const kubectl = join(
    process.env.DISTORT_CACHE ?? join(process.env.HOME ?? "/root", ".cache", "distort"),
    "kube",
    KUBE_VERSION,
    "kubectl",
  );
  expect(existsSync(kubectl)).toBe(true);
  const p = Bun.spawnSync([kubectl, "--kubeconfig", cp.kubeconfigPath, "get", "namespaces", "-o", "name"]);
  expect(p.exitCode).toBe(0);
  expect(p.stdout.toString()).toContain("namespace/kube-system");
});

test("stop() ends every process and frees every port, and is idempotent", async () => {
  const other = await startControlPlane({});
  const pids = other.pids();
  const ports = Object.values(other.ports);
  expect(pids.every(alive)).toBe(true);
  await other.stop();
  await other.stop();
  expect(pids.filter(alive)).toEqual([]);
  for (const p of ports) expect(await portIsFree(p)).toBe(true);
  expect(existsSync(other.dir)).toBe(false);
}, 120_000);

test("a parent killed without cleanup takes its control plane with it", async () => {
  const script = `
    import { startControlPlane } from ${JSON.stringify(join(import.meta.dir, "control-plane.ts"))};
    const cp = await startControlPlane({});
    console.log(JSON.stringify({ pids: cp.pids(), ports: Object.values(cp.ports), dir: cp.dir }));
    await new Promise(() => {});
  `;
  const child = Bun.spawn([process.execPath, "-e", script], { stdout: "pipe", stderr: "inherit" });
  const reader = child.stdout.getReader();
  let out = "";
  while (!out.includes("\n")) {
    const { value, done } = await reader.read();
    if (done) break;
    out += new TextDecoder().decode(value);
  }
  const { pids, ports, dir } = JSON.parse(out) as { pids: number[]; ports: number[]; dir: string };
  expect(pids.length).toBe(2);
  child.kill("SIGKILL");
  await child.exited;
  const deadline = Date.now() + 10_000;
  while (pids.some(alive) && Date.now() < deadline) await Bun.sleep(50);
  expect(pids.filter(alive)).toEqual([]);
  for (const p of ports) expect(await portIsFree(p)).toBe(true);
  // The killed parent could not remove its state directory; the test does.
  rmSync(dir, { recursive: true, force: true });
}, 120_000);
