// The node plugin's sweep of its own staged volumes. kubelet rebuilds what it knows after a
// restart from the Pods' volume directories only, so a kubelet that dies between NodeUnpublish and
// NodeUnstage forgets the staging mount: it stops reporting the volume in use, the attach/detach
// controller detaches it (the target drops this host), and the mount, the loop of a read-only view
// and the NVMe connection stay behind with nobody to call NodeUnstage. The sweep finds such a
// volume in the plugin's own records: one this node neither has attached (Node
// status.volumesAttached, written by the attach/detach controller) nor reports in use
// (status.volumesInUse, written by kubelet), on two sweeps in a row. It unstages it through the
// node service's own NodeUnstageVolume, so the same checks hold: a publication still mounted
// refuses, and a CSI call on the volume in progress makes the sweep skip it this time.
//
// kubelet stages a volume only once status.volumesAttached lists it, so a volume being staged is
// never a candidate; a Node that cannot be read makes the sweep do nothing.
import type { Clock } from "../../lib/clock.ts";
import { errorMessage, StorageError } from "../../lib/errors.ts";
import type { Logger } from "../../lib/log.ts";
import type { NodeStateStore } from "./state-store.ts";

/** The volume handles this node holds on to, by the Node's status (lib/kube/node-directory.ts nodeVolumeClaims). */
export interface NodeClaims {
  /** Handles in status.volumesAttached: the attach/detach controller has them attached here. */
  readonly attached: ReadonlySet<string>;
  /** Handles in status.volumesInUse: kubelet still has them mounted or means to. */
  readonly inUse: ReadonlySet<string>;
}

/** What one sweep did, per volume ID. */
export interface SweepReport {
  /** Unstaged: orphaned on this sweep and the one before. */
  readonly unstaged: readonly string[];
  /** Orphaned for the first time; unstaged on the next sweep if still so. */
  readonly suspected: readonly string[];
  /** Orphaned twice but refused (a publication still mounted, a failed unmount): with the reason. */
  readonly refused: readonly { readonly volumeId: string; readonly reason: string }[];
  /** Orphaned twice, but a CSI call on the volume was in progress: tried again next sweep. */
  readonly busy: readonly string[];
}

export interface StagingSweepDeps {
  readonly state: NodeStateStore;
  /** This node's claims, read fresh; a rejection makes the sweep act on nothing. */
  readonly claims: () => Promise<NodeClaims>;
  /** The node service's NodeUnstageVolume (its per-volume exclusion and checks included). */
  readonly unstage: (volumeId: string, stagingPath: string) => Promise<void>;
  /** Told of each volume unstaged or refused (an Event on the Node); must not throw. */
  readonly report?: (
    outcome: "unstaged" | "refused",
    volumeId: string,
    stagingPath: string,
    detail: string,
  ) => Promise<void>;
  readonly logger: Logger;
}

/**
 * Sweeps the node plugin's staged volumes for ones kubelet forgot (see the file comment). One
 * instance per plugin process: it remembers the previous sweep's suspects.
 */
export class StagingSweep {
  /** Volume ID to the staging path it was suspected at, from the previous sweep. */
  #suspects = new Map<string, string>();
  /** Volumes whose refusal was already reported, so a standing refusal is one Event, not one per sweep. */
  #reportedRefusals = new Set<string>();

  constructor(private readonly deps: StagingSweepDeps) {}

  async sweep(): Promise<SweepReport> {
    const { logger } = this.deps;
    // Records first, the Node after: a volume staged between the two reads is not looked at, and
    // one listed here was staged before the claims below were read.
    const records = await this.deps.state.list();
    let claims: NodeClaims;
    try {
      claims = await this.deps.claims();
    } catch (err) {
      // Without the Node's word, every volume could be in use: forget nothing, suspect nothing.
      logger.warn("staging sweep skipped: this node's volume status cannot be read", {
        err: errorMessage(err),
      });
      return { unstaged: [], suspected: [], refused: [], busy: [] };
    }
    const previous = this.#suspects;
    this.#suspects = new Map();
    const unstaged: string[] = [];
    const suspected: string[] = [];
    const refused: { volumeId: string; reason: string }[] = [];
    const busy: string[] = [];
    for (const rec of records) {
      const { volumeId, stagingPath } = rec;
      if (claims.attached.has(volumeId) || claims.inUse.has(volumeId)) {
        this.#reportedRefusals.delete(volumeId);
        continue;
      }
      if (previous.get(volumeId) !== stagingPath) {
        // First sight (or staged again elsewhere since): a kubelet between two status writes
        // gets one interval's grace.
        this.#suspects.set(volumeId, stagingPath);
        suspected.push(volumeId);
        continue;
      }
      const log = logger.with({ volume: volumeId, staging: stagingPath, nqn: rec.nqn });
      try {
        await this.deps.unstage(volumeId, stagingPath);
        unstaged.push(volumeId);
        this.#reportedRefusals.delete(volumeId);
        log.warn("unstaged a volume this node no longer has attached nor in use (kubelet lost track of it)");
        await this.deps.report?.(
          "unstaged",
          volumeId,
          stagingPath,
          `${volumeId} was still staged at ${stagingPath}, though this node has it neither attached nor in use; unmounted and disconnected`,
        );
      } catch (err) {
        if (err instanceof StorageError && err.kind === "busy") {
          // A CSI call holds the volume: kubelet knows of it after all, or is about to.
          this.#suspects.set(volumeId, stagingPath);
          busy.push(volumeId);
          continue;
        }
        const reason = errorMessage(err);
        this.#suspects.set(volumeId, stagingPath);
        refused.push({ volumeId, reason });
        log.warn("a volume this node has neither attached nor in use could not be unstaged", { err: reason });
        if (!this.#reportedRefusals.has(volumeId)) {
          this.#reportedRefusals.add(volumeId);
          await this.deps.report?.(
            "refused",
            volumeId,
            stagingPath,
            `${volumeId} is staged at ${stagingPath} though this node has it neither attached nor in use, and could not be unstaged: ${reason}`,
          );
        }
      }
    }
    // Volumes whose records went (unstaged by kubelet meanwhile) need no further word.
    for (const id of this.#reportedRefusals)
      if (!records.some((r) => r.volumeId === id)) this.#reportedRefusals.delete(id);
    return { unstaged, suspected, refused, busy };
  }

  /** Sweeps at once, then every `periodMs`, until `signal` aborts. A failed sweep is logged, never fatal. */
  async run(periodMs: number, clock: Clock, signal: AbortSignal): Promise<void> {
    while (!signal.aborted) {
      await this.sweep().catch((err: unknown) =>
        this.deps.logger.error("staging sweep failed", { err: errorMessage(err) }),
      );
      await clock.sleep(periodMs, signal).catch(() => {});
    }
  }
}
