// How every DISTORT binary ends: on SIGTERM or SIGINT it logs, runs its stop function once
// (a second signal while stopping changes nothing), and exits 0; a failing stop exits 1.
import { errorMessage } from "./errors.ts";
import type { Logger } from "./log.ts";

export function stopOnSignals(logger: Logger, what: string, stop: () => Promise<void>): void {
  let stopping = false;
  const handle = async (signal: string) => {
    if (stopping) return;
    stopping = true;
    logger.info(`${what} stopping`, { signal });
    try {
      await stop();
      process.exit(0);
    } catch (err) {
      logger.error(`${what} did not stop cleanly`, { err: errorMessage(err) });
      process.exit(1);
    }
  };
  process.on("SIGTERM", () => void handle("SIGTERM"));
  process.on("SIGINT", () => void handle("SIGINT"));
}
