// The `lab` command: DISTORT's control plane on one machine. Builds the Go tools on first use,
// starts etcd + kube-apiserver + kube-controller-manager, installs the CRDs and leaves a kubeconfig
// and kubectl ready until interrupted. `--once` checks that `kubectl get` works and exits.
import { mkdirSync, rmSync, symlinkSync } from "node:fs";
import { join, relative } from "node:path";
import { connect } from "../lib/kube/connection.ts";
import { startControlPlane } from "./cluster/control-plane.ts";
import { installCrds } from "./cluster/crds.ts";
import { ensureTools } from "./cluster/tools.ts";

const once = process.argv.includes("--once");
const root = join(import.meta.dir, "..");
const state = join(root, ".lab");
const say = (s: string) => process.stdout.write(`${s}\n`);

const t0 = performance.now();
const tools = await ensureTools();
rmSync(state, { recursive: true, force: true });
mkdirSync(join(state, "bin"), { recursive: true });
const cp = await startControlPlane({
  dir: join(state, "cluster"),
  controllerManager: true,
  tools,
  progress: (l) => say(`  ${l}`),
});
let stopping = false;
const shutdown = async (code: number) => {
  if (stopping) return;
  stopping = true;
  say("stopping the lab...");
  await cp.stop();
  process.exit(code);
};
process.on("SIGINT", () => void shutdown(0));
process.on("SIGTERM", () => void shutdown(0));

try {
  const crds = await installCrds(connect(cp.kubeconfigPath));
  const kubectl = join(state, "bin", "kubectl");
  symlinkSync(tools.kubectl, kubectl);
  say(`lab ready in ${Math.round(performance.now() - t0)} ms: ${crds.length} CRDs Established`);
  const rel = relative(process.cwd(), state) || ".";
  say(`  export KUBECONFIG=${join(rel, "cluster", "kubeconfig")} PATH=$PWD/${join(rel, "bin")}:$PATH`);
  say("  kubectl get crd; kubectl get distort -A");
  const check = Bun.spawnSync([kubectl, "--kubeconfig", cp.kubeconfigPath, "get", "crd", "-o", "name"]);
  say(check.stdout.toString().trim());
  if (check.exitCode !== 0) throw new Error(`kubectl get crd failed: ${check.stderr}`);
  const all = Bun.spawnSync([kubectl, "--kubeconfig", cp.kubeconfigPath, "get", "distort", "-A"]);
  if (all.exitCode !== 0) throw new Error(`kubectl get distort failed: ${all.stderr}`);
  say(all.stdout.toString().trim() || all.stderr.toString().trim());
  if (once) await shutdown(0);
  else say("running; Ctrl-C stops everything");
} catch (err) {
  process.stderr.write(`lab failed: ${err instanceof Error ? err.message : String(err)}\n`);
  await shutdown(1);
}
