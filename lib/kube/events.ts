// Kubernetes Events (events.k8s.io/v1) about DISTORT objects. Recording is best effort: a failed
// write is logged and never fails the reconcile that reported it. Repeats of the same event
// within a window are folded into one series so a hot loop cannot flood etcd.

import { randomBytes } from "node:crypto";
import * as k8s from "@kubernetes/client-node";
import { errorMessage } from "../errors.ts";
import type { Logger } from "../log.ts";
import type { KubeConnection } from "./connection.ts";
import type { KubeObject } from "./resource.ts";

export type EventType = "Normal" | "Warning";

export interface EventRecorderOptions {
  /** Reported as reportingController, e.g. "storage.distort.io/manager". */
  controller: string;
  /** Reported as reportingInstance, e.g. the Pod name. */
  instance: string;
  /** Identical events inside this window update one series instead of creating objects. */
  dedupWindowMs?: number;
  logger: Logger;
  now?: () => number;
}

interface Series {
  name: string;
  namespace: string;
  count: number;
  first: number;
  last: number;
}

export class EventRecorder {
  private readonly api: k8s.EventsV1Api;
  private readonly series = new Map<string, Series>();

  constructor(
    conn: KubeConnection,
    private readonly opts: EventRecorderOptions,
  ) {
    this.api = conn.api(k8s.EventsV1Api);
  }

  /**
   * Records `reason`/`note` about `regarding`. `action` is what the controller did or tried
   * (e.g. "Bind", "Export"). Resolves when written (or given up); never throws.
   */
  async record(
    regarding: KubeObject,
    type: EventType,
    reason: string,
    action: string,
    note: string,
  ): Promise<void> {
    const now = (this.opts.now ?? Date.now)();
    // The apiserver accepts events about cluster-scoped objects only in "default".
    const namespace = regarding.metadata.namespace ?? "default";
    const key = [regarding.metadata.uid ?? regarding.metadata.name, type, reason, action, note].join(
      "\u0000",
    );
    const window = this.opts.dedupWindowMs ?? 10 * 60_000;
    const prev = this.series.get(key);
    try {
      if (prev && now - prev.first < window) {
        prev.count++;
        prev.last = now;
        await this.api.patchNamespacedEvent(
          {
            name: prev.name,
            namespace: prev.namespace,
            body: { series: { count: prev.count, lastObservedTime: new k8s.V1MicroTime(now) } },
          },
          k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.MergePatch),
        );
        return;
      }
      if (this.series.size > 4096) this.series.clear();
      const name = `${regarding.metadata.name}.${randomBytes(8).toString("hex")}`;
      await this.api.createNamespacedEvent({
        namespace,
        body: {
          metadata: { name, namespace },
          eventTime: new k8s.V1MicroTime(now),
          type,
          reason,
          action,
          note: note.slice(0, 1024),
          reportingController: this.opts.controller,
          reportingInstance: this.opts.instance,
          regarding: {
            apiVersion: regarding.apiVersion,
            kind: regarding.kind,
            name: regarding.metadata.name,
            namespace: regarding.metadata.namespace,
            uid: regarding.metadata.uid,
            resourceVersion: regarding.metadata.resourceVersion,
          },
        },
      });
      this.series.set(key, { name, namespace, count: 1, first: now, last: now });
    } catch (err) {
      this.series.delete(key);
      this.opts.logger.warn("event not recorded", {
        reason,
        object: regarding.metadata.name,
        err: errorMessage(err),
      });
    }
  }
}
