// What the node service remembers about each staged volume (its NQN, staging path, access, device
// and publications), persisted so NodeUnstage, NodeGetVolumeStats and a restarted plugin can find
// the connection behind a volume ID: CSI hands those calls nothing but the ID and a path.
import { mkdirSync } from "node:fs";
import * as v from "valibot";
import { JsonRecordStore } from "../../lib/json-record-store.ts";
import type { AccessMode, VolumeAccess } from "./validate.ts";

/** One NodePublish of a staged volume. */
export interface Publication {
  readonly targetPath: string;
  readonly readonly: boolean;
  /** Read-only loop device bound instead of the device itself (read-only raw block publishes). */
  readonly view?: string;
}

const AccessSchema = v.variant("kind", [
  v.object({ kind: v.literal("block") }),
  v.object({
    kind: v.literal("mount"),
    fsType: v.picklist(["ext4", "xfs"]),
    mountFlags: v.array(v.string()),
  }),
]);

const StagedVolumeSchema = v.object({
  volumeId: v.pipe(v.string(), v.minLength(1)),
  stagingPath: v.pipe(v.string(), v.startsWith("/")),
  nqn: v.pipe(v.string(), v.minLength(1)),
  namespaceUUID: v.optional(v.string()),
  access: AccessSchema,
  mode: v.picklist([
    "SINGLE_NODE_WRITER",
    "SINGLE_NODE_SINGLE_WRITER",
    "SINGLE_NODE_MULTI_WRITER",
    "SINGLE_NODE_READER_ONLY",
    "MULTI_NODE_READER_ONLY",
    "MULTI_NODE_MULTI_WRITER",
  ]),
  device: v.optional(v.pipe(v.string(), v.startsWith("/dev/"))),
  publications: v.array(
    v.object({
      targetPath: v.pipe(v.string(), v.startsWith("/")),
      readonly: v.boolean(),
      view: v.optional(v.pipe(v.string(), v.startsWith("/dev/"))),
    }),
  ),
});

/** The record of one staged (or being staged) volume. */
export interface StagedVolume {
  readonly volumeId: string;
  readonly stagingPath: string;
  readonly nqn: string;
  readonly namespaceUUID?: string;
  readonly access: VolumeAccess;
  readonly mode: AccessMode;
  /** Set once the namespace's block device was found. */
  readonly device?: string;
  readonly publications: readonly Publication[];
}

/**
 * Durable per-volume records. put() replaces a record atomically: a crash leaves either the old
 * or the new one. Callers serialise access per volume ID; different IDs may be used concurrently.
 * A record that cannot be read back is StorageError "internal" rather than a silent "absent",
 * because forgetting a volume would leave its connection and mounts behind.
 */
export interface NodeStateStore {
  get(volumeId: string): Promise<StagedVolume | undefined>;
  put(record: StagedVolume): Promise<void>;
  /** Removes the record; absent is fine. */
  delete(volumeId: string): Promise<void>;
  list(): Promise<StagedVolume[]>;
}

/**
 * A NodeStateStore of one JSON file per volume ID in `dir`, created (0700) here so a plugin that
 * cannot write its state fails at start. The durability rules are JsonRecordStore's.
 */
export function fileStateStore(dir: string): NodeStateStore {
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  return new JsonRecordStore(dir, { schema: StagedVolumeSchema, key: (r) => r.volumeId, what: "node state" });
}
