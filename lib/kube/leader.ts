// Lease-based leader election (coordination.k8s.io/v1). One candidate holds the Lease and renews
// it; the others wait until it expires. The holder stops leading once it has failed to renew for
// renewDeadline, which is shorter than the lease duration, so two candidates never lead at once.
import * as k8s from "@kubernetes/client-node";
import type { Clock } from "../clock.ts";
import { errorMessage, StorageError } from "../errors.ts";
import type { Logger } from "../log.ts";
import type { KubeConnection } from "./connection.ts";
import { kubeError } from "./resource.ts";

export interface LeaderElectionOptions {
  namespace: string;
  name: string;
  /** Unique per process, e.g. pod name + random suffix. */
  identity: string;
  leaseDurationMs?: number;
  renewDeadlineMs?: number;
  retryPeriodMs?: number;
  /** Give the lease up on stop so a successor need not wait for expiry. */
  releaseOnStop?: boolean;
  clock: Clock;
  logger: Logger;
  /** Runs while leading; `signal` aborts when leadership is lost or stop() is called. */
  onStartedLeading(signal: AbortSignal): void | Promise<void>;
  onStoppedLeading?(): void;
  /** A new holder was observed (including this candidate). */
  onNewLeader?(identity: string): void;
}

interface Observed {
  holder: string;
  renewMs: number;
  durationMs: number;
  /** Local time when this record was last seen to change. */
  seenMs: number;
}

function micro(ms: number): k8s.V1MicroTime {
  return new k8s.V1MicroTime(ms);
}

/**
 * Validates the timing triple the same way client-go does: a holder must give up (renewDeadline)
 * well before others may take over (leaseDuration), and retry several times within the deadline.
 */
export function validateTimings(leaseMs: number, renewMs: number, retryMs: number): void {
  if (!(leaseMs > renewMs))
    throw new StorageError("invalid", "leaseDuration must be greater than renewDeadline");
  if (!(renewMs > retryMs * 1.2))
    throw new StorageError("invalid", "renewDeadline must exceed 1.2 x retryPeriod");
  if (!(retryMs > 0)) throw new StorageError("invalid", "retryPeriod must be positive");
}

export class LeaderElector {
  private readonly api: k8s.CoordinationV1Api;
  private readonly leaseMs: number;
  private readonly renewMs: number;
  private readonly retryMs: number;
  private observed: Observed | undefined;
  private leading = false;
  private readonly stopCtl = new AbortController();
  private running: Promise<void> | undefined;

  constructor(
    conn: KubeConnection,
    private readonly opts: LeaderElectionOptions,
  ) {
    this.api = conn.api(k8s.CoordinationV1Api);
    this.leaseMs = opts.leaseDurationMs ?? 15_000;
    this.renewMs = opts.renewDeadlineMs ?? 10_000;
    this.retryMs = opts.retryPeriodMs ?? 2_000;
    validateTimings(this.leaseMs, this.renewMs, this.retryMs);
  }

  isLeader(): boolean {
    return this.leading;
  }

  /** The holder last observed, if any. */
  get leader(): string | undefined {
    return this.observed?.holder || undefined;
  }

  /** Starts campaigning in the background; idempotent. */
  start(): void {
    this.running ??= this.campaign();
  }

  /** Stops campaigning or leading, releasing the lease when configured; resolves when done. */
  async stop(): Promise<void> {
    this.stopCtl.abort();
    await this.running;
  }

  private get stopped(): boolean {
    return this.stopCtl.signal.aborted;
  }

  private async sleep(ms: number): Promise<void> {
    await this.opts.clock.sleep(Math.max(0, ms), this.stopCtl.signal).catch(() => {});
  }

  private async campaign(): Promise<void> {
    while (!this.stopped) {
      // Acquire: poll, but wake right when the observed lease expires so takeover is not delayed.
      let acquired = false;
      while (!this.stopped && !acquired) {
        acquired = await this.tryAcquireOrRenew();
        if (!acquired) {
          const o = this.observed;
          const untilExpiry = o ? o.renewMs + o.durationMs - this.opts.clock.now() + 5 : this.retryMs;
          await this.sleep(Math.min(this.retryMs, Math.max(untilExpiry, 10)));
        }
      }
      if (this.stopped) break;
      await this.lead();
    }
  }

  private async lead(): Promise<void> {
    this.leading = true;
    const ctl = new AbortController();
    const log = this.opts.logger;
    log.info("started leading", { lease: this.opts.name, identity: this.opts.identity });
    const work = Promise.resolve()
      .then(() => this.opts.onStartedLeading(ctl.signal))
      .catch((err) => log.error("leader work failed", { err: errorMessage(err) }));
    let lastRenew = this.opts.clock.now();
    while (!this.stopped) {
      await this.sleep(this.retryMs);
      if (this.stopped) break;
      const attemptStart = this.opts.clock.now();
      // A renew that hangs must not keep us leading: the deadline bounds the wait, not the call.
      const remaining = lastRenew + this.renewMs - attemptStart;
      const renewed = await Promise.race([
        this.tryAcquireOrRenew(),
        this.opts.clock.sleep(Math.max(0, remaining)).then(() => false),
      ]);
      if (renewed) {
        lastRenew = attemptStart; // renewTime written is <= this, so our deadline ends first
        continue;
      }
      if (this.observed && this.observed.holder !== this.opts.identity) break; // someone else holds it
      if (this.opts.clock.now() - lastRenew >= this.renewMs) break; // could not renew in time
    }
    // Give up leadership before anyone else may legitimately take it.
    this.leading = false;
    ctl.abort();
    log.info("stopped leading", { lease: this.opts.name, identity: this.opts.identity });
    this.opts.onStoppedLeading?.();
    await work;
    if (this.stopped && this.opts.releaseOnStop !== false) await this.release();
  }

  private observe(lease: k8s.V1Lease): void {
    const spec = lease.spec ?? {};
    const holder = spec.holderIdentity ?? "";
    const renewMs = spec.renewTime ? new Date(spec.renewTime).getTime() : 0;
    const durationMs = (spec.leaseDurationSeconds ?? 0) * 1000;
    const prev = this.observed;
    const now = this.opts.clock.now();
    if (!prev || prev.holder !== holder || prev.renewMs !== renewMs) {
      if (prev?.holder !== holder && holder) this.opts.onNewLeader?.(holder);
      // Clock-skew guard: a renewTime far in our future is not trusted; expiry counts from now.
      this.observed = {
        holder,
        renewMs: renewMs > now + durationMs ? now : renewMs,
        durationMs,
        seenMs: now,
      };
    }
  }

  /** One attempt; true when this candidate holds the lease afterwards. Never throws. */
  private async tryAcquireOrRenew(): Promise<boolean> {
    const { namespace, name, identity } = this.opts;
    const now = this.opts.clock.now();
    const durationSeconds = Math.ceil(this.leaseMs / 1000);
    try {
      let lease: k8s.V1Lease;
      try {
        lease = await this.api.readNamespacedLease({ name, namespace });
      } catch (err) {
        if (kubeError(err, "read lease").kind !== "not-found") throw err;
        const created = await this.api.createNamespacedLease({
          namespace,
          body: {
            metadata: { name, namespace },
            spec: {
              holderIdentity: identity,
              leaseDurationSeconds: durationSeconds,
              acquireTime: micro(now),
              renewTime: micro(now),
              leaseTransitions: 0,
            },
          },
        });
        this.observe(created);
        return true;
      }
      this.observe(lease);
      const spec = lease.spec ?? {};
      const holder = spec.holderIdentity ?? "";
      const o = this.observed as Observed;
      if (holder && holder !== identity && o.renewMs + o.durationMs > now) return false;
      const takeover = holder !== identity;
      const updated = await this.api.replaceNamespacedLease({
        name,
        namespace,
        body: {
          ...lease,
          spec: {
            ...spec,
            holderIdentity: identity,
            leaseDurationSeconds: durationSeconds,
            renewTime: micro(now),
            acquireTime: takeover ? micro(now) : spec.acquireTime,
            leaseTransitions: (spec.leaseTransitions ?? 0) + (takeover && holder ? 1 : 0),
          },
        },
      });
      this.observe(updated);
      return true;
    } catch (err) {
      const e = kubeError(err, "lease");
      if (e.kind !== "conflict" && e.kind !== "already-exists") {
        this.opts.logger.warn("lease attempt failed", { lease: name, err: e.message });
      }
      return false;
    }
  }

  private async release(): Promise<void> {
    const { namespace, name, identity } = this.opts;
    try {
      const lease = await this.api.readNamespacedLease({ name, namespace });
      if (lease.spec?.holderIdentity !== identity) return;
      const now = this.opts.clock.now();
      await this.api.replaceNamespacedLease({
        name,
        namespace,
        body: {
          ...lease,
          spec: { ...lease.spec, holderIdentity: "", leaseDurationSeconds: 1, renewTime: micro(now) },
        },
      });
    } catch (err) {
      this.opts.logger.warn("lease release failed", { lease: name, err: errorMessage(err) });
    }
  }
}
