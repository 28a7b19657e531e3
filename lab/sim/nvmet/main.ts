// The simulated Linux nvmet as a lab process: serves the SimFabric from a simulated configfs tree
// (written by an agent in another process), with nvmet's debugfs view of controllers and a notice
// socket through which the writer's configfs calls wait for nvmet to act. Stops on SIGTERM.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { createLogger } from "../../../lib/log.ts";
import { stopOnSignals } from "../../../lib/signals.ts";
import { createFabric, createTcpFabric } from "../spdk/fabric.ts";
import { serveChangeNotices } from "./change-notice.ts";
import { nvmetDeviceResolver, parseDeviceNames } from "./device-names.ts";
import { startSimNvmet } from "./sim-nvmet.ts";

const USAGE = `usage: bun lab/sim/nvmet/main.ts --root <dir> (--fabric-dir <dir> | --fabric tcp) [options]
  --root <dir>           host root of the simulated configfs (holds sys/kernel/config/nvmet)
  --fabric-dir <dir>     shared SimFabric directory
  --fabric tcp           the fabric over real TCP: ports listen on addr_traddr:addr_trsvcid
                         (the real-cluster lab, where nvmet runs in the node's network namespace)
  --notice-socket <path> where configfs writers send change notices (default <root>/nvmet.sock)
  --watch-ms <n>         backstop rescan period in ms (default 1000; 0: notices only)
  --no-debugfs           do not keep <root>/sys/kernel/debug/nvmet (a kernel without it)
  --device-map <file>    JSON {"nvme0n1": "loop7"}: a device_path naming the node's disks (or their
                         partitions) opens that loop device; other device_paths open under <root>
                         (default: device_path as given)`;

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      root: { type: "string" },
      "fabric-dir": { type: "string" },
      fabric: { type: "string" },
      "notice-socket": { type: "string" },
      "watch-ms": { type: "string" },
      "no-debugfs": { type: "boolean" },
      "device-map": { type: "string" },
      help: { type: "boolean", short: "h" },
    },
  });
  const tcp = values.fabric === "tcp";
  if (values.fabric !== undefined && !tcp) throw new Error(`--fabric ${values.fabric}: only tcp is known`);
  if (values.help || !values.root || (!values["fabric-dir"] && !tcp)) {
    process.stderr.write(`${USAGE}\n`);
    process.exit(values.help ? 0 : 2);
  }
  const root = values.root;
  const log = createLogger({ level: "info", fields: { process: "nvmet" } });
  const watchMs = Number(values["watch-ms"] ?? "1000");
  if (!Number.isInteger(watchMs) || watchMs < 0)
    throw new Error(`--watch-ms ${values["watch-ms"]} is not a count`);
  const nvmet = await startSimNvmet({
    nvmetDir: join(root, "sys/kernel/config/nvmet"),
    fabric: tcp ? createTcpFabric() : createFabric(values["fabric-dir"] ?? ""),
    ...(values["no-debugfs"] ? {} : { debugfsDir: join(root, "sys/kernel/debug/nvmet") }),
    watchIntervalMs: watchMs,
    ...(values["device-map"]
      ? {
          resolveDevice: nvmetDeviceResolver(
            parseDeviceNames(readFileSync(values["device-map"], "utf8")),
            root,
          ),
        }
      : {}),
    log,
  });
  const notices = await serveChangeNotices(values["notice-socket"] ?? join(root, "nvmet.sock"), () =>
    nvmet.rescan(),
  );
  log.info("nvmet serving", { root });
  stopOnSignals(log, "nvmet", async () => {
    await notices.close();
    await nvmet.close();
  });
}

await main();
