// Kubernetes Events from reconcilers without waiting on them: a reconcile emits and moves on; the
// write happens in the background (best effort, like every Event) and stop() waits for stragglers.
import type { EventType } from "../lib/kube/events.ts";
import type { KubeObject } from "../lib/kube/resource.ts";
import type { Logger } from "../lib/log.ts";

/** Where events go; lib/kube/events.ts's EventRecorder is one. Must never throw. */
export interface EventSink {
  record(regarding: KubeObject, type: EventType, reason: string, action: string, note: string): Promise<void>;
}

/** Fire-and-forget front of an EventSink, with a bound on writes in flight. */
export class EventPort {
  readonly #inflight = new Set<Promise<void>>();

  constructor(
    private readonly sink: EventSink,
    private readonly log: Logger,
    /** Beyond this many unfinished writes, new events are logged and dropped, not queued. */
    private readonly maxInFlight = 256,
  ) {}

  /** Records an event in the background; never throws, never blocks the caller. */
  emit(regarding: KubeObject, type: EventType, reason: string, action: string, note: string): void {
    if (this.#inflight.size >= this.maxInFlight) {
      this.log.warn("event dropped: too many in flight", { reason, object: regarding.metadata.name, note });
      return;
    }
    const p = this.sink.record(regarding, type, reason, action, note).catch(() => {});
    this.#inflight.add(p);
    void p.finally(() => this.#inflight.delete(p));
  }

  /** Resolves once every event emitted so far has been written or given up. */
  async drain(): Promise<void> {
    while (this.#inflight.size > 0) await Promise.allSettled([...this.#inflight]);
  }
}
