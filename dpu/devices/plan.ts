// Pure decisions behind CreateDevice: the bdev_nvme_attach_controller params for each portal,
// which paths an existing controller still lacks, whether a saved device matches a new request,
// and what to do with the block device's content in Filesystem mode. No I/O here.

import { StorageError } from "../../lib/errors.ts";
import type { DeviceContent } from "../../lib/host/blkid.ts";
import type { NvmeAttachParams } from "../../lib/spdk/methods.ts";
import type { NvmeController } from "../../lib/spdk/schemas.ts";
import type { DeviceNames } from "./names.ts";
import {
  accessModeNames,
  type DeviceSpec,
  FS_TYPES,
  type FsType,
  type Portal,
  type Transport,
} from "./request.ts";
import type { DeviceRecord } from "./state-store.ts";

/** SNAP's transport names for DISTORT's transports (SNAP's accelerated TCP is "NVDA_TCP"). */
export type TrtypeMap = Readonly<Record<Transport, string>>;

/** Everything bdev_nvme_attach_controller needs beyond the spec. */
export interface AttachContext {
  readonly names: DeviceNames;
  /** The DPU's host NQN: the identity the target's ACL (and DH-HMAC-CHAP) checks. */
  readonly hostNqn: string;
  readonly trtypes: TrtypeMap;
  /** Keyring name of the DH-HMAC-CHAP secret, when the volume uses one. */
  readonly dhchapKey?: string;
}

/**
 * The attach params for each portal, in the spec's order. Every path carries the same name,
 * subsystem, host NQN, key and reconnect settings, as SPDK requires of the paths of one
 * controller; `multipath` is sent only when there is more than one portal.
 */
export function attachParamsFor(spec: DeviceSpec, ctx: AttachContext): NvmeAttachParams[] {
  const multi = spec.target.portals.length > 1;
  return spec.target.portals.map((p) => ({
    name: ctx.names.controller,
    trtype: ctx.trtypes[spec.target.transport],
    adrfam: p.adrfam,
    traddr: p.address,
    trsvcid: String(p.port),
    subnqn: spec.target.nqn,
    hostnqn: ctx.hostNqn,
    ...(ctx.dhchapKey ? { dhchap_key: ctx.dhchapKey } : {}),
    ctrlr_loss_timeout_sec: spec.reconnect.ctrlrLossTimeoutSec,
    reconnect_delay_sec: spec.reconnect.reconnectDelaySec,
    fast_io_fail_timeout_sec: spec.reconnect.fastIoFailTimeoutSec,
    ...(multi ? { multipath: spec.multipath } : {}),
  }));
}

type Trid = NvmeController["ctrlrs"][number]["trid"];

function samePath(t: Trid, p: Portal, nqn: string): boolean {
  return (
    t.traddr.toLowerCase() === p.address.toLowerCase() &&
    (t.trsvcid ?? "") === String(p.port) &&
    (t.subnqn ?? "") === nqn
  );
}

/** Every path (trid) a controller reports, including SPDK's alternate_trids. */
function pathsOf(c: NvmeController): Trid[] {
  const out: Trid[] = [];
  for (const x of c.ctrlrs) {
    out.push(x.trid);
    const alt = (x as { alternate_trids?: unknown }).alternate_trids;
    if (Array.isArray(alt)) {
      for (const t of alt) {
        if (t && typeof t === "object" && typeof (t as Trid).traddr === "string") out.push(t as Trid);
      }
    }
  }
  return out;
}

/** The portals of `spec` that `existing` (our controller, if any) does not reach yet. Pure. */
export function missingPortals(spec: DeviceSpec, existing: NvmeController | undefined): Portal[] {
  if (!existing) return [...spec.target.portals];
  const have = pathsOf(existing);
  return spec.target.portals.filter((p) => !have.some((t) => samePath(t, p, spec.target.nqn)));
}

/**
 * Why the controllers SNAP has forbid attaching this device, or undefined. Pure. Our controller
 * connected to another subsystem or as another host cannot take the new paths (SPDK would answer
 * a bare -22); another controller already reaching the subsystem as this host would make SPDK's
 * second connect a duplicate and split the volume between two bdevs.
 */
export function controllerConflict(
  spec: DeviceSpec,
  ctx: AttachContext,
  controllers: readonly NvmeController[],
): string | undefined {
  const ours = controllers.find((c) => c.name === ctx.names.controller);
  if (ours) {
    const first = ours.ctrlrs[0];
    if (first?.trid.subnqn !== undefined && first.trid.subnqn !== spec.target.nqn) {
      return `SNAP controller ${ours.name} is connected to ${first.trid.subnqn}, not ${spec.target.nqn}; DeleteDevice it first`;
    }
    const host = first?.host?.nqn;
    if (host !== undefined && host !== "" && host !== ctx.hostNqn) {
      return `SNAP controller ${ours.name} is connected as host ${host}, but this plugin is configured as ${ctx.hostNqn}; DeleteDevice it first`;
    }
  }
  for (const c of controllers) {
    if (c.name === ctx.names.controller) continue;
    const hostOk = c.ctrlrs.some((x) => (x.host?.nqn ?? ctx.hostNqn) === ctx.hostNqn);
    const reaches = pathsOf(c).some((t) => spec.target.portals.some((p) => samePath(t, p, spec.target.nqn)));
    if (hostOk && reaches) {
      return `SNAP controller ${c.name} already reaches ${spec.target.nqn} as host ${ctx.hostNqn}; it was not created for volume ${spec.volumeId} by this plugin`;
    }
  }
  return undefined;
}

/**
 * Why a saved device cannot stand for this request, or undefined when it can. Pure. Access modes
 * and volume mode are the API's identity of a device; the subsystem NQN is the volume itself
 * (the same volume id with another NQN is another volume). Portals, reconnect settings and keys
 * may change between attempts and are taken from the newest request.
 */
export function recordMismatch(record: DeviceRecord, spec: DeviceSpec): string | undefined {
  const diffs: string[] = [];
  const want = [...spec.accessModes].sort((a, b) => a - b);
  const have = [...record.accessModes].sort((a, b) => a - b);
  if (want.join(",") !== have.join(",")) {
    diffs.push(`access modes ${accessModeNames(have)} (requested ${accessModeNames(want)})`);
  }
  if (record.volumeMode !== spec.volumeMode) {
    diffs.push(`volume mode ${record.volumeMode} (requested ${spec.volumeMode})`);
  }
  if (record.nqn !== spec.target.nqn) diffs.push(`subsystem ${record.nqn} (requested ${spec.target.nqn})`);
  if (diffs.length === 0) return undefined;
  return `a device for volume ${spec.volumeId} already exists with ${diffs.join(", ")}; DeleteDevice it first`;
}

/** What CreateDevice does with a Filesystem volume's block device. */
export interface FilesystemPlan {
  /** Set when the device is blank and gets this filesystem. */
  readonly format?: FsType;
  readonly mountAs: FsType;
}

/**
 * Formats only a blank device, and never a read-only one; mounts an existing ext4 or xfs as it is
 * unless the fsType parameter asks for another. Pure; StorageError "precondition" when the
 * content forbids going on (data is never overwritten).
 */
export function planFilesystem(
  content: DeviceContent,
  opts: { fsType?: FsType; defaultFsType: FsType; readonly: boolean; volumeId: string },
): FilesystemPlan {
  if (content.kind === "blank") {
    if (opts.readonly) {
      throw new StorageError(
        "precondition",
        `volume ${opts.volumeId} holds no filesystem and is read-only (ROX): there is nothing to mount`,
      );
    }
    const fs = opts.fsType ?? opts.defaultFsType;
    return { format: fs, mountAs: fs };
  }
  if (content.kind === "other") {
    throw new StorageError(
      "precondition",
      `volume ${opts.volumeId} holds ${content.description}, not a filesystem this plugin mounts; it is left untouched`,
    );
  }
  const found = content.fsType as FsType;
  if (!FS_TYPES.includes(found)) {
    throw new StorageError(
      "precondition",
      `volume ${opts.volumeId} holds a ${content.fsType} filesystem; this plugin mounts ${FS_TYPES.join(" or ")}`,
    );
  }
  if (opts.fsType !== undefined && opts.fsType !== found) {
    throw new StorageError(
      "precondition",
      `volume ${opts.volumeId} already holds ${found}, but the fsType parameter asks for ${opts.fsType}; it is not reformatted`,
    );
  }
  return { mountAs: found };
}
