// `bun run sanity`: the CSI conformance run. Builds csi-sanity (kubernetes-csi/csi-test) from the
// Go module proxy into the tool cache, starts a real control plane, the manager, a storage node
// (agent + emulated nvmf_tgt over simulated drives) and the csi binary whose node side stages
// onto loop devices, runs the whole suite against the csi socket, and ends with one line
// "csi-sanity: N passed, M failed, K skipped (identities: ...)". Every component runs as its own
// chart ServiceAccount unless DISTORT_SANITY_IDENTITIES=admin. Exits non-zero on any failure.
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { startControlPlane } from "../lab/cluster/control-plane.ts";
import { cacheRoot, ensureTools } from "../lab/cluster/tools.ts";
import { type StackIdentities, startStack } from "../lab/harness/stack.ts";
import { createLogger } from "../lib/log.ts";

export const CSI_TEST_VERSION = "v5.6.0";
const GiB = 1024 ** 3;
const say = (s: string) => process.stdout.write(`${s}\n`);

async function buildCsiSanity(): Promise<string> {
  const p = Bun.spawn(["bash", join(import.meta.dir, "..", "lab", "cluster", "build-csi-sanity.sh")], {
    env: { ...process.env, CSI_TEST_VERSION },
    stdout: "inherit",
    stderr: "inherit",
  });
  if ((await p.exited) !== 0) throw new Error("building csi-sanity failed");
  return join(cacheRoot(), "csi-sanity", CSI_TEST_VERSION, "csi-sanity");
}

/** Reads ginkgo's closing summary: "N Passed | M Failed | P Pending | K Skipped". */
export function parseGinkgoSummary(
  out: string,
): { passed: number; failed: number; skipped: number } | undefined {
  const m = /(\d+) Passed \| (\d+) Failed \| (\d+) Pending \| (\d+) Skipped/.exec(out);
  if (!m) return undefined;
  return { passed: Number(m[1]), failed: Number(m[2]), skipped: Number(m[4]) };
}

if (import.meta.main) {
  const t0 = performance.now();
  const [sanity] = await Promise.all([buildCsiSanity(), ensureTools()]);
  const cp = await startControlPlane({ progress: (l) => say(`  ${l}`) });
  const identities: StackIdentities =
    process.env.DISTORT_SANITY_IDENTITIES === "admin" ? "admin" : "chart-service-accounts";
  const logger = createLogger({ level: (process.env.DISTORT_SANITY_LOG as "info") ?? "error" });
  let code = 1;
  try {
    const stack = await startStack({
      kubeconfigPath: cp.kubeconfigPath,
      storageNodes: [
        {
          name: "storage-1",
          drives: [
            { serial: "SANITY0001", pciAddress: "0000:3b:00.0", sizeBytes: 16 * GiB },
            { serial: "SANITY0002", pciAddress: "0000:3c:00.0", sizeBytes: 16 * GiB },
          ],
        },
      ],
      consumerNodes: ["worker-1"],
      csiAllInOne: true,
      identities,
      logger,
      fast: true,
    });
    try {
      // Identity and Node on the plugin endpoint, Controller on its own instance's socket.
      const endpoint = stack.csiPluginEndpoint;
      const controller = stack.csiController;
      if (!endpoint || !controller) throw new Error("csi did not start");
      say(
        stack.identity.size === 0
          ? "identities: admin (every component uses the admin kubeconfig)"
          : `identities: ${[...stack.identity.values()].map((i) => `${i.component}=${i.username}`).join(", ")}`,
      );
      const work = join(stack.dir, "sanity");
      mkdirSync(work, { recursive: true });
      const params = join(work, "parameters.yaml");
      writeFileSync(params, "transport: tcp\n");
      // What a VolumeAttributesClass would carry: the ModifyVolume specs create and modify with it.
      const mutable = join(work, "mutable-parameters.yaml");
      writeFileSync(mutable, 'qos.rwIops: "2000"\nqos.wMBps: "40"\n');
      say(`stack ready in ${Math.round(performance.now() - t0)} ms; running csi-sanity ${CSI_TEST_VERSION}`);
      const run = Bun.spawn(
        [
          sanity,
          `--csi.endpoint=${endpoint}`,
          `--csi.controllerendpoint=${controller.address}`,
          `--csi.stagingdir=${join(work, "staging")}`,
          `--csi.mountdir=${join(work, "mount")}`,
          `--csi.testvolumesize=${64 * 1024 * 1024}`,
          `--csi.testvolumeexpandsize=${128 * 1024 * 1024}`,
          `--csi.testvolumeparameters=${params}`,
          `--csi.testvolumemutableparameters=${mutable}`,
          "--ginkgo.timeout=20m",
          "--ginkgo.no-color",
          ...process.argv.slice(2),
        ],
        { stdout: "pipe", stderr: "inherit" },
      );
      let out = "";
      const dec = new TextDecoder();
      for await (const chunk of run.stdout) {
        const t = dec.decode(chunk);
        out += t;
        process.stdout.write(t);
      }
      const exit = await run.exited;
      const summary = parseGinkgoSummary(out);
      if (!summary) {
        say(
          `csi-sanity: 0 passed, 1 failed, 0 skipped (no summary; exit ${exit}; identities: ${identities})`,
        );
      } else {
        say(
          `csi-sanity: ${summary.passed} passed, ${summary.failed} failed, ${summary.skipped} skipped (identities: ${identities})`,
        );
        code = summary.failed === 0 && exit === 0 ? 0 : 1;
      }
    } finally {
      await stack.stop();
    }
  } finally {
    await cp.stop();
  }
  process.exit(code);
}
