// Keeps the serving lease file (agent/watchdog/lease.ts) up to date for the target watchdog.
// Writes are serialised and coalesced: a write asked for while one runs is made once it ends,
// with the newest content, so the file never goes back to an older lease.
import type { Logger } from "../../lib/log.ts";
import { writeFileAtomic } from "./atomic-file.ts";
import type { Lease } from "./lease.ts";

export class LeaseWriter {
  #running: Promise<void> | undefined;
  #next: Lease | undefined;
  #lastWritten: string | undefined;

  constructor(
    private readonly o: {
      path: string;
      logger: Logger;
      /** The file write; default tmp + rename. */
      write?: (path: string, text: string) => Promise<void>;
    },
  ) {}

  /**
   * Asks for `lease` to be written; resolves once it (or a newer one) is on disk or failed.
   * Never rejects: a failed write is logged (the watchdog then fences at the older deadline,
   * failing closed) and the next call tries again.
   */
  write(lease: Lease): Promise<void> {
    this.#next = lease;
    this.#running ??= this.#drain().finally(() => {
      this.#running = undefined;
    });
    return this.#running;
  }

  async #drain(): Promise<void> {
    const write = this.o.write ?? writeFileAtomic;
    for (let i = 0; i < 100 && this.#next; i++) {
      const lease = this.#next;
      this.#next = undefined;
      const text = `${JSON.stringify(lease)}\n`;
      if (text === this.#lastWritten) continue;
      try {
        await write(this.o.path, text);
        this.#lastWritten = text;
      } catch (err) {
        this.o.logger.error(
          "serving lease not written: the target watchdog fences at the previous lease's deadline",
          {
            path: this.o.path,
            err: (err as Error).message,
          },
        );
      }
    }
  }
}
