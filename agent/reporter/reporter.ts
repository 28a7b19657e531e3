// The agent's reporter: every period it discovers the node's drives and RDMA endpoint and
// publishes them, creating missing NVMeDevice objects, keeping their mutable spec fields current,
// marking drives missing from a complete scan Unavailable (claim kept), and refreshing the node's
// RDMAStorageNode status and heartbeat. It observes and describes; it never changes hardware.

import { API_VERSION, type Backend } from "../../api/common.ts";
import type { NVMeDevice } from "../../api/nvme-device.ts";
import type { RDMAStorageNode } from "../../api/rdma-storage-node.ts";
import { RDMAStorageNodeConditionTypes } from "../../api/rdma-storage-node.ts";
import type { Clock } from "../../lib/clock.ts";
import { errorMessage, StorageError } from "../../lib/errors.ts";
import { findCondition } from "../../lib/kube/conditions.ts";
import type { EventType } from "../../lib/kube/events.ts";
import type { KubeObject, ResourceClient } from "../../lib/kube/resource.ts";
import { updateStatus } from "../../lib/kube/status.ts";
import type { Logger } from "../../lib/log.ts";
import { nvmeDeviceName } from "../discovery/device-name.ts";
import { type DiscoveredDevice, type DiscoveryResult, failedHealth } from "../discovery/inventory.ts";
import type { EndpointResult } from "../discovery/rdma-endpoint.ts";
import {
  type DeviceObservation,
  identityMatches,
  newDevice,
  nextDeviceStatus,
  specPatch,
} from "./device-object.ts";
import { claimedCapacity, nextNodeStatus } from "./node-status.ts";
import { DEFAULT_REPORT_PERIOD_MS, runPeriodically } from "./periodic.ts";

/** Where the reporter's Events go; lib/kube/events.ts EventRecorder satisfies it. Never rejects. */
export interface EventSink {
  record(regarding: KubeObject, type: EventType, reason: string, action: string, note: string): Promise<void>;
}

export interface ReporterConfig {
  /** This node's Kubernetes name: NVMeDevice spec.nodeName and the RDMAStorageNode's name. */
  readonly nodeName: string;
  /** Namespace of the RDMAStorageNode. */
  readonly namespace: string;
  /** Delay between passes; default 30 s. */
  readonly periodMs?: number;
  /**
   * The one backend the agent serves, when it serves only one: present devices not yet locked
   * are locked to it (nextDeviceStatus). Absent: devices stay unlocked until first provisioned.
   */
  readonly onlyBackend?: Backend;
}

export interface ReporterDeps {
  /** Writes NVMeDevices (and reads single ones). */
  readonly devices: ResourceClient<NVMeDevice>;
  /**
   * This node's NVMeDevices, for instance a WatchCache's list() with the field selector
   * spec.nodeName=<node>; objects of other nodes are ignored. A slightly stale answer is safe:
   * every write starts from a fresh read. Default: a full list, filtered here.
   */
  readonly listDevices?: () => Promise<readonly NVMeDevice[]>;
  readonly storageNodes: ResourceClient<RDMAStorageNode>;
  /** One discovery pass (agent/discovery discoverDevices bound to its ports). */
  readonly discover: () => Promise<DiscoveryResult>;
  /** The node's RDMA endpoint (agent/discovery findRdmaEndpoint bound to a NetworkSource). */
  readonly findEndpoint: () => Promise<EndpointResult>;
  /** Partitions this node exports now; owned by the partition manager. */
  readonly exportCount: () => Promise<number>;
  /** Transports of the partitions this node exports now (status.servedTransports); optional. */
  readonly servedTransports?: () => Promise<readonly string[]>;
  readonly events: EventSink;
  readonly clock: Clock;
  readonly logger: Logger;
  /**
   * Called (synchronously, not awaited) each time a heartbeat the API server took moves
   * lastHeartbeatMs() forward, with its time: the agent renews the target watchdog's lease here.
   * It must not throw or block.
   */
  readonly afterHeartbeat?: (heartbeatMs: number) => void;
}

/** What one pass did, by NVMeDevice name; for logs and tests. */
export interface ReportSummary {
  readonly complete: boolean;
  readonly created: string[];
  readonly updated: string[];
  readonly unavailable: string[];
  readonly restored: string[];
  /** One line per object that could not be written; the pass carried on with the others. */
  readonly errors: string[];
  readonly storageNode?: RDMAStorageNode;
}

/**
 * Publishes this node's hardware. reportOnce() is safe to repeat at any time and after a crash at
 * any point (create looks up first, every write is computed from the latest object); concurrent
 * calls share the pass in flight. Absence is only ever inferred from a complete scan.
 */
export class Reporter {
  #inflight: Promise<ReportSummary> | undefined;
  #lastHeartbeatMs: number | undefined;

  constructor(
    private readonly deps: ReporterDeps,
    private readonly config: ReporterConfig,
  ) {}

  /**
   * One pass. Rejects only when the node's devices cannot be listed or its RDMAStorageNode cannot
   * be written (then no heartbeat is published, so the manager expires the node: fail closed);
   * a failing device write is logged, counted in `errors` and does not stop the pass.
   */
  reportOnce(): Promise<ReportSummary> {
    this.#inflight ??= this.#pass().finally(() => {
      this.#inflight = undefined;
    });
    return this.#inflight;
  }

  /** Runs passes every period until `signal` aborts; a failed pass is logged and retried next period. */
  run(signal: AbortSignal): Promise<void> {
    return runPeriodically(
      this.deps.clock,
      this.config.periodMs ?? DEFAULT_REPORT_PERIOD_MS,
      signal,
      async () => {
        try {
          await this.reportOnce();
        } catch (err) {
          this.deps.logger.error("reporter pass failed", {
            node: this.config.nodeName,
            err: errorMessage(err),
          });
        }
      },
    );
  }

  /**
   * Writes the heartbeat alone (status.lastHeartbeatTime of this node's RDMAStorageNode, the rest
   * of its status as the last full pass left it), between the full passes: a replicated volume's
   * serving node counts as lost after failoverAfterSeconds without one, far sooner than a full
   * pass comes by default. Nothing is written before a full pass has created the status. Resolves
   * true when the write went through (then lastHeartbeatMs() is its time).
   */
  async heartbeat(): Promise<boolean> {
    const { deps, config } = this;
    const now = deps.clock.now();
    const written = await updateStatus(deps.storageNodes, config.nodeName, config.namespace, (o) =>
      o.status?.lastHeartbeatTime !== undefined && o.spec.nodeName === config.nodeName
        ? { ...o.status, lastHeartbeatTime: new Date(now).toISOString() }
        : undefined,
    );
    const ok = written?.status?.lastHeartbeatTime === new Date(now).toISOString();
    if (ok) this.#advance(now);
    return ok;
  }

  #advance(ms: number): void {
    if (this.#lastHeartbeatMs !== undefined && ms <= this.#lastHeartbeatMs) return;
    this.#lastHeartbeatMs = ms;
    try {
      this.deps.afterHeartbeat?.(ms);
    } catch (err) {
      this.deps.logger.error("after-heartbeat hook failed", { err: errorMessage(err) });
    }
  }

  /** Clock time of the newest heartbeat the API server took (a full pass's or heartbeat()'s), undefined before the first. */
  lastHeartbeatMs(): number | undefined {
    return this.#lastHeartbeatMs;
  }

  /** Writes heartbeats every `periodMs` until `signal` aborts; a failed write is logged and retried next period. */
  runHeartbeats(signal: AbortSignal, periodMs: number): Promise<void> {
    return runPeriodically(this.deps.clock, periodMs, signal, async () => {
      try {
        await this.heartbeat();
      } catch (err) {
        this.deps.logger.warn("heartbeat not written", {
          node: this.config.nodeName,
          err: errorMessage(err),
        });
      }
    });
  }

  async #observe(): Promise<
    [DiscoveryResult, EndpointResult, number | undefined, readonly string[] | undefined]
  > {
    const { deps } = this;
    return Promise.all([
      deps.discover().catch((err): DiscoveryResult => {
        const h = failedHealth("DiscoveryFailed", errorMessage(err));
        return { devices: [], kernel: h, spdk: h, complete: false, problems: [], skipped: [] };
      }),
      deps.findEndpoint().catch(
        (err): EndpointResult => ({
          ok: false,
          reason: "NetworkDiscoveryFailed",
          message: errorMessage(err),
        }),
      ),
      deps.exportCount().catch((err) => {
        deps.logger.warn("export count unavailable; keeping the previous value", { err: errorMessage(err) });
        return undefined;
      }),
      (deps.servedTransports?.() ?? Promise.resolve(undefined)).catch((err) => {
        deps.logger.warn("served transports unavailable; keeping the previous value", {
          err: errorMessage(err),
        });
        return undefined;
      }),
    ]);
  }

  async #pass(): Promise<ReportSummary> {
    const { deps, config } = this;
    const node = config.nodeName;
    const log = deps.logger.with({ node });
    const [scan, endpoint, exportCount, servedTransports] = await this.#observe();
    const now = new Date(deps.clock.now());
    const summary = {
      complete: scan.complete,
      created: [] as string[],
      updated: [] as string[],
      unavailable: [] as string[],
      restored: [] as string[],
      errors: [] as string[],
    };

    const listed = deps.listDevices ? await deps.listDevices() : (await deps.devices.list()).items;
    const mine = listed.filter((d) => d.spec.nodeName === node);
    const byName = new Map(mine.map((d) => [d.metadata.name, d]));
    // The latest known state of this node's devices, for the capacity totals.
    const latest = new Map(byName);

    for (const d of scan.devices) {
      const name = nvmeDeviceName(node, d.serial);
      try {
        const obj = await this.#present(name, d, byName.get(name), now, summary);
        latest.set(name, obj);
      } catch (err) {
        summary.errors.push(`${name}: ${errorMessage(err)}`);
        log.error("NVMeDevice not updated", { device: name, serial: d.serial, err: errorMessage(err) });
      }
    }

    const seenSerials = new Set(scan.devices.map((d) => d.serial));
    const skippedWhy = new Map(
      scan.skipped.filter((s) => s.serial !== undefined).map((s) => [s.serial, s.reason]),
    );
    for (const obj of [...latest.values()]) {
      if (seenSerials.has(obj.spec.serial)) continue;
      if (!scan.complete) {
        // An incomplete scan proves nothing about absence; NVMeInventoryReady=False blocks placement instead.
        log.debug("device not seen by an incomplete scan; left as it is", { device: obj.metadata.name });
        continue;
      }
      const why = skippedWhy.get(obj.spec.serial);
      try {
        const after = await this.#absent(
          obj,
          why === undefined ? { kind: "absent" } : { kind: "absent", why },
          now,
          summary,
        );
        if (after) latest.set(obj.metadata.name, after);
        else latest.delete(obj.metadata.name);
      } catch (err) {
        summary.errors.push(`${obj.metadata.name}: ${errorMessage(err)}`);
        log.error("NVMeDevice not marked unavailable", { device: obj.metadata.name, err: errorMessage(err) });
      }
    }

    const storageNode = await this.#storageNode(
      {
        endpoint,
        inventory: scan,
        capacity: claimedCapacity(latest.values(), node),
        exportCount,
        servedTransports,
      },
      now,
    );
    log.info("reported", {
      complete: scan.complete,
      devices: scan.devices.length,
      created: summary.created.length,
      updated: summary.updated.length,
      unavailable: summary.unavailable.length,
      restored: summary.restored.length,
      errors: summary.errors.length,
    });
    return { ...summary, ...(storageNode ? { storageNode } : {}) };
  }

  /** Creates or refreshes the object of a discovered drive; returns its latest state. */
  async #present(
    name: string,
    d: DiscoveredDevice,
    existing: NVMeDevice | undefined,
    now: Date,
    summary: { created: string[]; updated: string[]; restored: string[] },
  ): Promise<NVMeDevice> {
    const { deps, config } = this;
    let obj = existing;
    if (!obj) {
      try {
        obj = await deps.devices.create(newDevice(name, config.nodeName, d));
        summary.created.push(name);
        await deps.events.record(
          obj,
          "Normal",
          "DeviceDiscovered",
          "Discover",
          `serial ${d.serial} at ${d.pciAddress} (${d.activeBackend}), ${d.allocatableBytes} bytes allocatable`,
        );
      } catch (err) {
        if (!(err instanceof StorageError && err.kind === "already-exists")) throw err;
        obj = await deps.devices.get(name);
        if (!obj) throw err;
      }
    }
    if (!identityMatches(obj, config.nodeName, d.serial)) {
      await deps.events.record(
        obj,
        "Warning",
        "DeviceIdentityConflict",
        "Discover",
        `name belongs to serial ${d.serial} on ${config.nodeName}, but the object is for serial ${obj.spec.serial} on ${obj.spec.nodeName}`,
      );
      throw new StorageError(
        "precondition",
        `NVMeDevice ${name} is for serial ${JSON.stringify(obj.spec.serial)} on ${obj.spec.nodeName}; left untouched`,
      );
    }
    const patch = specPatch(obj.spec, d);
    if (patch) {
      const before = obj.spec;
      obj = await deps.devices.mergePatch(name, undefined, { spec: patch });
      summary.updated.push(name);
      const changes = Object.keys(patch)
        .map(
          (k) =>
            `${k} ${String(before[k as keyof typeof patch])} -> ${String(patch[k as keyof typeof patch])}`,
        )
        .join(", ");
      await deps.events.record(obj, "Normal", "DeviceUpdated", "Discover", changes);
    }
    let phaseBefore: string | undefined;
    const written = await updateStatus(deps.devices, name, undefined, (o) => {
      phaseBefore = o.status?.phase;
      return nextDeviceStatus(o, { kind: "present", device: d }, now, this.config.onlyBackend);
    });
    if (!written) throw new StorageError("not-found", `NVMeDevice ${name} was deleted during the pass`);
    if (phaseBefore === "Unavailable" && written.status?.phase !== "Unavailable") {
      summary.restored.push(name);
      await deps.events.record(
        written,
        "Normal",
        "DeviceReappeared",
        "Discover",
        `serial ${d.serial} is back at ${d.pciAddress}; phase ${written.status?.phase}`,
      );
    }
    return written;
  }

  /** Marks a device missing from a complete scan Unavailable; returns its latest state (undefined if deleted). */
  async #absent(
    obj: NVMeDevice,
    obs: DeviceObservation,
    now: Date,
    summary: { unavailable: string[] },
  ): Promise<NVMeDevice | undefined> {
    const { deps } = this;
    const name = obj.metadata.name;
    let phaseBefore: string | undefined;
    const written = await updateStatus(deps.devices, name, undefined, (o) => {
      phaseBefore = o.status?.phase;
      return nextDeviceStatus(o, obs, now);
    });
    if (written && phaseBefore !== "Unavailable") {
      summary.unavailable.push(name);
      const claim = written.status?.claimRef;
      await deps.events.record(
        written,
        "Warning",
        "DeviceMissing",
        "Discover",
        `serial ${obj.spec.serial} absent from a complete scan${obs.kind === "absent" && obs.why ? ` (${obs.why})` : ""}` +
          (claim ? `; claim ${claim.namespace}/${claim.name} kept` : ""),
      );
    }
    return written;
  }

  /** Creates the node's RDMAStorageNode if missing and writes its status; returns the stored object. */
  async #storageNode(
    obs: Parameters<typeof nextNodeStatus>[2],
    now: Date,
  ): Promise<RDMAStorageNode | undefined> {
    const { deps, config } = this;
    const { nodeName: name, namespace } = config;
    let sn = await deps.storageNodes.get(name, namespace);
    if (!sn) {
      try {
        sn = await deps.storageNodes.create({
          apiVersion: API_VERSION,
          kind: "RDMAStorageNode",
          metadata: { name, namespace },
          spec: { nodeName: name },
        });
      } catch (err) {
        if (!(err instanceof StorageError && err.kind === "already-exists")) throw err;
        sn = await deps.storageNodes.get(name, namespace);
      }
    }
    if (sn && sn.spec.nodeName !== name) {
      throw new StorageError(
        "precondition",
        `RDMAStorageNode ${namespace}/${name} describes node ${sn.spec.nodeName}; not overwriting it`,
      );
    }
    const type = RDMAStorageNodeConditionTypes.NVMeInventoryReady;
    let before: string | undefined;
    const written = await updateStatus(deps.storageNodes, name, namespace, (o) => {
      before = findCondition(o.status?.conditions ?? [], type)?.status;
      const next = nextNodeStatus(o.status, o.metadata.generation, obs, now);
      // A heartbeat written while this pass ran is newer than its `now`: never go back in time.
      const prev = o.status?.lastHeartbeatTime;
      return prev !== undefined && Date.parse(prev) > now.getTime()
        ? { ...next, lastHeartbeatTime: prev }
        : next;
    });
    if (written?.status?.lastHeartbeatTime === now.toISOString()) this.#advance(now.getTime());
    const after = written ? findCondition(written.status?.conditions ?? [], type) : undefined;
    if (written && after && after.status !== before) {
      await deps.events.record(
        written,
        after.status === "True" ? "Normal" : "Warning",
        after.status === "True" ? "InventoryComplete" : "InventoryIncomplete",
        "Discover",
        after.message,
      );
    }
    return written;
  }
}
