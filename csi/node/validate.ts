// The pure validation core of the Node service: volume IDs, volume capabilities (access type,
// filesystem, mount flags, access mode) and the volume/publish contexts. Everything here runs
// before any side effect and fails with StorageError "invalid" (INVALID_ARGUMENT).
import * as v from "valibot";
import { VolumeCapability_AccessMode_Mode as Mode, type VolumeCapability } from "../../gen/csi/v1/csi_pb.ts";
import {
  PublishContextKeys,
  PublishContextSchema,
  VolumeContextKeys,
  VolumeContextSchema,
} from "../../lib/volume-context.ts";
import { describeIssues, invalidArgument } from "../errors.ts";
import { FS_TYPES, type FsType } from "../host/mounter.ts";
import type { ConnectParams } from "../host/nvme-initiator.ts";
import { namespaceIdDigits } from "../host/nvme-initiator.ts";

/** Longest volume ID accepted, in bytes. */
export const MAX_VOLUME_ID_BYTES = 1024;

/**
 * Access modes the node serves: the single-node writer modes, the two reader-only modes (several
 * nodes may read; the controller never lets a writer in beside them), and MULTI_NODE_MULTI_WRITER
 * for raw block only (a live migration's two hosts; the controller admits no third).
 * MULTI_NODE_SINGLE_WRITER is refused.
 */
export type AccessMode =
  | "SINGLE_NODE_WRITER"
  | "SINGLE_NODE_SINGLE_WRITER"
  | "SINGLE_NODE_MULTI_WRITER"
  | "SINGLE_NODE_READER_ONLY"
  | "MULTI_NODE_READER_ONLY"
  | "MULTI_NODE_MULTI_WRITER";

const SUPPORTED_MODES: ReadonlyMap<Mode, AccessMode> = new Map([
  [Mode.SINGLE_NODE_WRITER, "SINGLE_NODE_WRITER"],
  [Mode.SINGLE_NODE_SINGLE_WRITER, "SINGLE_NODE_SINGLE_WRITER"],
  [Mode.SINGLE_NODE_MULTI_WRITER, "SINGLE_NODE_MULTI_WRITER"],
  [Mode.SINGLE_NODE_READER_ONLY, "SINGLE_NODE_READER_ONLY"],
  [Mode.MULTI_NODE_READER_ONLY, "MULTI_NODE_READER_ONLY"],
  [Mode.MULTI_NODE_MULTI_WRITER, "MULTI_NODE_MULTI_WRITER"],
]);

/**
 * True for the reader-only modes: the node stages them read-only (the device set read-only,
 * filesystems mounted `ro`, never formatted) and publishes them read-only whatever the request's
 * readonly flag says.
 */
export function isReaderMode(mode: AccessMode): boolean {
  return mode === "SINGLE_NODE_READER_ONLY" || mode === "MULTI_NODE_READER_ONLY";
}

/** How the workload uses the volume. */
export type VolumeAccess =
  | { readonly kind: "block" }
  | { readonly kind: "mount"; readonly fsType: FsType; readonly mountFlags: readonly string[] };

export interface Capability {
  readonly access: VolumeAccess;
  readonly mode: AccessMode;
  /**
   * The group id a mounted volume is to be usable by (volume_mount_group, Kubernetes' fsGroup
   * under VOLUME_MOUNT_GROUP); undefined when the CO sent none. Applied per publication.
   */
  readonly mountGroup?: number;
}

/** Largest group id accepted: (gid_t)-1 is "no change" to chown(2), so one below it. */
export const MAX_GID = 4294967294;

/** Where NodeStage connects, from the volume context, plus the host identity from the publish context. */
export interface StageTarget {
  readonly connect: Omit<ConnectParams, "hostNqn">;
  /** Every other portal of the subsystem (multipath), connected as further paths. */
  readonly morePortals: readonly { readonly address: string; readonly port: number }[];
  /** Namespace UUID/NGUID when the controller reported one; the device is found by it. */
  readonly namespaceUUID: string | undefined;
  /** The host NQN the controller put on the target's ACL for this attachment. */
  readonly hostNqn: string;
  readonly attachmentId: string;
  /** The StorageClass's mkfsOptions, unparsed (NodeStage checks them against the filesystem). */
  readonly mkfsOptions: string | undefined;
}

const invalid = invalidArgument;

/** `id` when it is a usable volume ID: non-empty, no NUL, at most MAX_VOLUME_ID_BYTES. */
export function requireVolumeId(id: string): string {
  if (id.length === 0) throw invalid("volume_id is empty");
  if (id.includes("\0")) throw invalid("volume_id contains a NUL byte");
  if (Buffer.byteLength(id) > MAX_VOLUME_ID_BYTES)
    throw invalid(`volume_id is longer than ${MAX_VOLUME_ID_BYTES} bytes`);
  return id;
}

// Flags that would turn "mount this filesystem" into another operation on another object.
const FORBIDDEN_FLAGS = new Set(["bind", "rbind", "remount", "move"]);

/**
 * Mount flags as given, each non-empty and free of NUL/newline and of operation-changing flags.
 * mount(8) reads "-o" as one comma-separated list, so each flag is checked element by element: a
 * flag "ro,remount" would otherwise pass as one harmless-looking string.
 */
export function checkMountFlags(flags: readonly string[]): string[] {
  for (const f of flags) {
    if (/[\0\n]/.test(f)) throw invalid("mount_flags contains a NUL or newline");
    for (const part of f.split(",")) {
      const opt = part.trim();
      if (opt === "") throw invalid("mount_flags contains an empty flag");
      if (FORBIDDEN_FLAGS.has(opt.toLowerCase())) throw invalid(`mount flag "${opt}" is not allowed`);
    }
  }
  return [...flags];
}

/**
 * The capability as the node supports it: block, or mount with ext4/xfs (an empty fs_type means
 * `defaultFsType`), in a single-node writer mode or a reader-only mode. Anything else is "invalid": the plugin never
 * supports it, whatever the volume.
 */
export function parseCapability(cap: VolumeCapability | undefined, defaultFsType: FsType): Capability {
  if (cap === undefined) throw invalid("volume_capability is missing");
  const rawMode = cap.accessMode?.mode ?? Mode.UNKNOWN;
  const mode = SUPPORTED_MODES.get(rawMode);
  if (mode === undefined) {
    throw invalid(
      `access mode ${Mode[rawMode] ?? rawMode} is not supported; a volume has one writing node, only readers, or two writers of a raw block device`,
      {
        mode: Mode[rawMode] ?? rawMode,
      },
    );
  }
  switch (cap.accessType.case) {
    case "block":
      return { access: { kind: "block" }, mode };
    case "mount": {
      if (mode === "MULTI_NODE_MULTI_WRITER")
        throw invalid(
          "access mode MULTI_NODE_MULTI_WRITER is served for raw block volumes only: a filesystem mounted on two nodes would be corrupted",
          { mode },
        );
      const m = cap.accessType.value;
      const fsType = m.fsType === "" ? defaultFsType : m.fsType;
      if (!(FS_TYPES as readonly string[]).includes(fsType)) {
        throw invalid(`fs_type "${m.fsType}" is not supported (use ${FS_TYPES.join(" or ")})`, {
          fsType: m.fsType,
        });
      }
      let mountGroup: number | undefined;
      if (m.volumeMountGroup !== "") {
        mountGroup = /^\d{1,10}$/.test(m.volumeMountGroup) ? Number(m.volumeMountGroup) : Number.NaN;
        if (!(mountGroup <= MAX_GID))
          throw invalid(
            `volume_mount_group "${m.volumeMountGroup}" is not a numeric group id (0..${MAX_GID})`,
          );
      }
      return {
        access: { kind: "mount", fsType: fsType as FsType, mountFlags: checkMountFlags(m.mountFlags) },
        mode,
        ...(mountGroup === undefined ? {} : { mountGroup }),
      };
    }
    default:
      throw invalid("volume_capability has neither block nor mount access type");
  }
}

/** True when two accesses are the same use of a volume (kind, filesystem and flags). */
export function sameAccess(a: VolumeAccess, b: VolumeAccess): boolean {
  if (a.kind === "block" || b.kind === "block") return a.kind === b.kind;
  return a.fsType === b.fsType && a.mountFlags.join("\n") === b.mountFlags.join("\n");
}

/**
 * Parses NodeStage's volume_context and publish_context with the controller's schemas
 * (csi/context.ts). Keys the schemas do not know are ignored (the CO adds its own).
 */
export function parseStageContexts(
  volumeContext: Readonly<Record<string, string>>,
  publishContext: Readonly<Record<string, string>>,
): StageTarget {
  const vc = v.safeParse(VolumeContextSchema, volumeContext);
  if (!vc.success) throw invalid(describeIssues("volume_context is malformed", vc.issues));
  const pc = v.safeParse(PublishContextSchema, publishContext);
  if (!pc.success) throw invalid(describeIssues("publish_context is malformed", pc.issues));
  const ctx = vc.output;
  const namespaceUUID = ctx[VolumeContextKeys.namespaceUUID];
  if (namespaceUUID !== undefined && namespaceIdDigits(namespaceUUID) === undefined) {
    throw invalid(`volume_context ${VolumeContextKeys.namespaceUUID} is not a UUID or NGUID`);
  }
  return {
    connect: {
      transport: ctx[VolumeContextKeys.transport],
      address: ctx[VolumeContextKeys.portalIP],
      port: ctx[VolumeContextKeys.portalPort],
      nqn: ctx[VolumeContextKeys.nqn],
      ctrlLossTmo: ctx[VolumeContextKeys.ctrlLossTmo],
      reconnectDelay: ctx[VolumeContextKeys.reconnectDelay],
      fastIoFailTmo: ctx[VolumeContextKeys.fastIoFailTmo],
    },
    // The volume's own further portals, then a replicated volume's serving and standby nodes
    // as the publish named them (its volume context keeps the node that served at creation).
    morePortals: [
      ...(ctx[VolumeContextKeys.portals] ?? []),
      ...(pc.output[PublishContextKeys.portals] ?? []),
    ].filter(
      (p, i, all) =>
        !(p.address === ctx[VolumeContextKeys.portalIP] && p.port === ctx[VolumeContextKeys.portalPort]) &&
        all.findIndex((q) => q.address === p.address && q.port === p.port) === i,
    ),
    namespaceUUID,
    hostNqn: pc.output[PublishContextKeys.hostNQN],
    attachmentId: pc.output[PublishContextKeys.attachmentId],
    mkfsOptions: ctx[VolumeContextKeys.mkfsOptions],
  };
}
