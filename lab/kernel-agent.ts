// The lab's kernel-backend agent process: agent/main.ts unchanged, on a host whose configfs is the
// simulated one (each write waits for the simulated nvmet process to act, as a configfs syscall
// runs nvmet's callbacks) and whose NVMe drives are loop devices under their nvme names.
// Usage: DISTORT_* env as for agent/main.ts; bun lab/kernel-agent.ts --sim-notice-socket=PATH
//   --sim-device-map=FILE (JSON {"nvme0n1": "loop7"}). DISTORT_HOST_ROOT is the node's sim root.
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { parseAgentConfig } from "../agent/config.ts";
import { runAgent } from "../agent/main.ts";
import { errorMessage } from "../lib/errors.ts";
import { hostExec } from "../lib/exec.ts";
import { createLogger } from "../lib/log.ts";
import { stopOnSignals } from "../lib/signals.ts";
import { simConfigfs } from "./sim/configfs/sim-configfs.ts";
import { changeNotifier } from "./sim/nvmet/change-notice.ts";
import {
  deviceNamedExec,
  deviceNamedFs,
  parseDeviceNames,
  realDevicePath,
} from "./sim/nvmet/device-names.ts";

if (import.meta.main) {
  let cfg: ReturnType<typeof parseAgentConfig>;
  let noticeSocket: string;
  let deviceMap: string;
  try {
    const { values } = parseArgs({
      options: { "sim-notice-socket": { type: "string" }, "sim-device-map": { type: "string" } },
    });
    if (!values["sim-notice-socket"] || !values["sim-device-map"])
      throw new Error("--sim-notice-socket and --sim-device-map are required");
    noticeSocket = values["sim-notice-socket"];
    deviceMap = values["sim-device-map"];
    cfg = parseAgentConfig(process.env);
  } catch (err) {
    process.stderr.write(`lab kernel-agent: ${errorMessage(err)}\n`);
    process.exit(2);
  }
  const logger = createLogger({ level: cfg.logLevel, fields: { component: "agent", node: cfg.nodeName } });
  const names = parseDeviceNames(readFileSync(deviceMap, "utf8"));
  const root = cfg.hostRoot;
  const configfs = simConfigfs(root, {
    onChange: changeNotifier(noticeSocket),
    // nvmet opens device_path when a namespace is enabled: the loop device behind the name.
    deviceExists: async (p) => existsSync(realDevicePath(names, p) ?? join(root, p)),
  });
  try {
    const agent = await runAgent(cfg, logger, {
      hostFs: deviceNamedFs(configfs, names),
      exec: deviceNamedExec(hostExec, names),
    });
    stopOnSignals(logger, "agent", () => agent.stop());
  } catch (err) {
    logger.error("agent failed to start", { err: errorMessage(err) });
    process.exit(1);
  }
}
