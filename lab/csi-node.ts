// The lab's CSI node plugin process: the csi binary's node service, unchanged, with the simulated
// fabric in place of nvme-cli (namespaces appear as loop devices over the targets' lvol extents).
// Usage: bun lab/csi-node.ts <csi flags...> --sim-fabric-dir=DIR --sim-spdk-socket=PATH [...]
import { join } from "node:path";
import { parseCsiConfig, USAGE } from "../csi/config.ts";
import { runCsi } from "../csi/main.ts";
import { errorMessage } from "../lib/errors.ts";
import { hostExec } from "../lib/exec.ts";
import { createLogger } from "../lib/log.ts";
import { stopOnSignals } from "../lib/signals.ts";
import { multiTargetResolver } from "./harness/stack.ts";
import { SimNvmeInitiator } from "./sim/fabric/sim-initiator.ts";
import { createFabric } from "./sim/spdk/fabric.ts";

/** Splits the --sim-* options (the hardware stand-in) from the csi binary's own flags. */
export function splitSimArgs(argv: string[]): { csi: string[]; fabricDir: string; spdkSockets: string[] } {
  const csi: string[] = [];
  let fabricDir: string | undefined;
  const spdkSockets: string[] = [];
  for (const a of argv) {
    if (a.startsWith("--sim-fabric-dir=")) fabricDir = a.slice("--sim-fabric-dir=".length);
    else if (a.startsWith("--sim-spdk-socket=")) spdkSockets.push(a.slice("--sim-spdk-socket=".length));
    else csi.push(a);
  }
  if (!fabricDir) throw new Error("--sim-fabric-dir is required");
  if (spdkSockets.length === 0) throw new Error("at least one --sim-spdk-socket is required");
  return { csi, fabricDir, spdkSockets };
}

if (import.meta.main) {
  let parsed: ReturnType<typeof splitSimArgs>;
  let cfg: ReturnType<typeof parseCsiConfig>;
  try {
    parsed = splitSimArgs(process.argv.slice(2));
    cfg = parseCsiConfig(parsed.csi, process.env);
  } catch (err) {
    process.stderr.write(`lab csi-node: ${errorMessage(err)}\n${USAGE}\n`);
    process.exit(2);
  }
  const logger = createLogger({
    level: cfg.logLevel,
    fields: { component: "csi", mode: cfg.mode, ...(cfg.nodeId ? { node: cfg.nodeId } : {}) },
  });
  const resolver = multiTargetResolver(parsed.spdkSockets, logger);
  const initiator = new SimNvmeInitiator({
    fabric: createFabric(parsed.fabricDir),
    stateDir: join(cfg.stateDir, "initiator"),
    exec: hostExec,
    backing: resolver.resolve,
    logger: logger.with({ component: "initiator" }),
  });
  try {
    const running = await runCsi(cfg, logger, { node: { initiator } });
    stopOnSignals(logger, "csi", async () => {
      await running.stop();
      await resolver.close();
    });
  } catch (err) {
    logger.error("csi failed to start", { err: errorMessage(err) });
    process.exit(1);
  }
}
