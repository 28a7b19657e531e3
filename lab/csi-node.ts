// The lab's CSI node plugin process: the csi binary's node service, unchanged, with the lab host's
// NVMe driver (its own process, lab/sim/fabric/host-daemon.ts) in place of nvme-cli and the kernel.
// Usage: bun lab/csi-node.ts <csi flags...> --sim-host-socket=PATH
import { parseCsiConfig, USAGE } from "../csi/config.ts";
import { runCsi } from "../csi/main.ts";
import { errorMessage } from "../lib/errors.ts";
import { createLogger } from "../lib/log.ts";
import { stopOnSignals } from "../lib/signals.ts";
import { HostControlInitiator } from "./sim/fabric/host-control.ts";

/** Splits the --sim-* option (the host daemon's control socket) from the csi binary's own flags. */
export function splitSimArgs(argv: string[]): { csi: string[]; hostSocket: string } {
  const csi: string[] = [];
  let hostSocket: string | undefined;
  for (const a of argv) {
    if (a.startsWith("--sim-host-socket=")) hostSocket = a.slice("--sim-host-socket=".length);
    else csi.push(a);
  }
  if (!hostSocket) throw new Error("--sim-host-socket is required");
  return { csi, hostSocket };
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
  const initiator = new HostControlInitiator(parsed.hostSocket);
  try {
    const running = await runCsi(cfg, logger, { node: { initiator } });
    stopOnSignals(logger, "csi", () => running.stop());
  } catch (err) {
    logger.error("csi failed to start", { err: errorMessage(err) });
    process.exit(1);
  }
}
