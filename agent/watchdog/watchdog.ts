// The target watchdog: runs in the Pod that runs nvmf_tgt, beside it, and fences the nexus
// exports of a serving agent that stopped renewing its lease (dead, wedged, crash-looping) once
// the lease's deadline passes: every listener of each listed subsystem ANA inaccessible, over
// its own SPDK JSON-RPC connection, re-checked until it holds. It records what it fenced for the
// agent to read when it comes back, and never sets a listener optimized. No Kubernetes access.
import { readFile } from "node:fs/promises";
import type { Clock } from "../../lib/clock.ts";
import { errorMessage } from "../../lib/errors.ts";
import type { Logger } from "../../lib/log.ts";
import type { SpdkMethods } from "../../lib/spdk/methods.ts";
import { writeFileAtomic } from "./atomic-file.ts";
import { decideWatchdog, listenersToFence } from "./decide.ts";
import { type FenceRecord, type Lease, type LeaseRead, parseLease } from "./lease.ts";

/** How often a fence that held is checked again while the lease stays expired. */
export const RECHECK_HELD_MS = 2_000;

export interface WatchdogOptions {
  leasePath: string;
  recordPath: string;
  /** The node this runs on; when set, a lease naming another node is malformed. */
  node?: string;
  spdk: Pick<
    SpdkMethods,
    "nvmfGetSubsystems" | "nvmfSubsystemGetListeners" | "nvmfSubsystemListenerSetAnaState"
  >;
  clock: Clock;
  logger: Logger;
  /** The fence record write; default tmp + rename. */
  writeRecord?: (path: string, text: string) => Promise<void>;
}

/** What one poll did; for tests and logs. */
export interface PollResult {
  /** Subsystems due to be fenced this poll (empty: the lease stands or there is none). */
  due: string[];
  /** Listeners set inaccessible this poll, as "nqn traddr:trsvcid". */
  set: string[];
  /** True when every due subsystem's listeners were inaccessible at the end of the poll. */
  held: boolean;
}

export class TargetWatchdog {
  #remembered: Lease | undefined;
  #lastMalformed: string | undefined;
  /** The lease (by heartbeat) whose fence last held, and when it was last checked. */
  #held: { heartbeatMs: number; nqns: string; checkedMs: number } | undefined;
  #recorded: string | undefined;

  constructor(private readonly o: WatchdogOptions) {}

  async #read(): Promise<LeaseRead> {
    let text: string;
    try {
      text = await readFile(this.o.leasePath, "utf8");
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === "ENOENT") return { kind: "missing" };
      return { kind: "malformed", why: `unreadable: ${errorMessage(err)}` };
    }
    return parseLease(text, this.o.node);
  }

  /** One poll: read the lease, decide, fence what is due. Rejects when SPDK could not be reached. */
  async poll(): Promise<PollResult> {
    const nowMs = this.o.clock.now();
    const d = decideWatchdog({ read: await this.#read(), remembered: this.#remembered, nowMs });
    this.#remembered = d.remembered;
    if (d.malformed !== undefined) {
      if (d.malformed !== this.#lastMalformed)
        this.o.logger.error("serving lease malformed: acting on the last valid one", {
          path: this.o.leasePath,
          why: d.malformed,
          lastValidHeartbeatMs: d.remembered?.heartbeatMs,
        });
      this.#lastMalformed = d.malformed;
    } else this.#lastMalformed = undefined;
    const expired = d.expired;
    if (!expired) {
      this.#held = undefined;
      return { due: [], set: [], held: true };
    }
    const key = d.fence.join(",");
    const h = this.#held;
    if (h && h.heartbeatMs === expired.heartbeatMs && h.nqns === key && nowMs - h.checkedMs < RECHECK_HELD_MS)
      return { due: d.fence, set: [], held: true };
    const set: string[] = [];
    let held = true;
    const present = new Set((await this.o.spdk.nvmfGetSubsystems()).map((s) => s.nqn));
    await Promise.all(
      d.fence.map(async (nqn) => {
        // Gone from the target (restarted, taken down): nothing listens for it.
        if (!present.has(nqn)) return;
        try {
          const plan = listenersToFence(await this.o.spdk.nvmfSubsystemGetListeners(nqn));
          if (plan.noAna.length > 0) {
            held = false;
            this.o.logger.error("cannot fence: listener reports no ANA state", {
              nqn,
              listeners: plan.noAna,
            });
          }
          for (const a of plan.set) {
            await this.o.spdk.nvmfSubsystemListenerSetAnaState({
              nqn,
              listen_address: {
                trtype: a.trtype,
                adrfam: (a.adrfam ?? "IPv4") as "IPv4",
                traddr: a.traddr,
                trsvcid: a.trsvcid ?? "",
              },
              ana_state: "inaccessible",
            });
            set.push(`${nqn} ${a.traddr}:${a.trsvcid ?? ""}`);
          }
        } catch (err) {
          // Listed a moment ago and gone now is not a failure to hold; anything else is retried.
          held = false;
          this.o.logger.warn("fence not applied yet; retrying", { nqn, err: errorMessage(err) });
        }
      }),
    );
    if (set.length > 0)
      this.o.logger.warn(
        "serving lease expired: the agent did not renew it; listeners set ANA inaccessible",
        {
          node: expired.node,
          heartbeatMs: expired.heartbeatMs,
          fenceAtMs: expired.fenceAtMs,
          lateMs: nowMs - (expired.fenceAtMs ?? nowMs),
          listeners: set,
        },
      );
    if (held) {
      this.#held = { heartbeatMs: expired.heartbeatMs, nqns: key, checkedMs: nowMs };
      await this.#record(expired, d.fence, nowMs);
    }
    return { due: d.fence, set, held };
  }

  /** Writes the fence record once per expired lease (and again if its list changed). */
  async #record(lease: Lease, nqns: string[], nowMs: number): Promise<void> {
    const id = `${lease.heartbeatMs}|${nqns.join(",")}`;
    if (this.#recorded === id) return;
    const record: FenceRecord = {
      version: 1,
      node: lease.node,
      fencedAtMs: nowMs,
      leaseHeartbeatMs: lease.heartbeatMs,
      fenceAtMs: lease.fenceAtMs ?? nowMs,
      nqns,
    };
    try {
      await (this.o.writeRecord ?? writeFileAtomic)(this.o.recordPath, `${JSON.stringify(record)}\n`);
      this.#recorded = id;
      this.o.logger.info("fence record written", { path: this.o.recordPath, nqns });
    } catch (err) {
      this.o.logger.error("fence record not written; retrying", {
        path: this.o.recordPath,
        err: errorMessage(err),
      });
    }
  }

  /** Polls every `pollMs` until `signal` aborts; a failed poll is logged and retried next time. */
  async run(signal: AbortSignal, pollMs: number): Promise<void> {
    let lastErr: string | undefined;
    while (!signal.aborted) {
      try {
        await this.poll();
        lastErr = undefined;
      } catch (err) {
        const msg = errorMessage(err);
        if (msg !== lastErr) this.o.logger.warn("watchdog poll failed; retrying", { err: msg });
        lastErr = msg;
      }
      await this.o.clock.sleep(pollMs, signal).catch(() => {});
    }
  }
}
