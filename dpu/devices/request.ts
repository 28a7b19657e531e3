// Validation of every StoragePluginService request: ids, access modes, volume mode, the DISTORT
// volume context (csi/context.ts keys) and the storage parameters this plugin understands, turned
// into a DeviceSpec with defaults filled in. Pure: bad input is StorageError "invalid" naming the
// field, never a half-done device.
import * as v from "valibot";
import { AccessMode } from "../../gen/nvidia/storage/plugins/v1/plugin_pb.ts";
import { StorageError } from "../../lib/errors.ts";
import { nqnProblem } from "../../lib/spdk/nqn.ts";
import { VolumeContextKeys, VolumeContextSchema } from "../../lib/volume-context.ts";

/** Longest volume id accepted, in bytes (Kubernetes object names reach 253). */
export const MAX_VOLUME_ID_BYTES = 256;
/** Longest device name accepted, in bytes. */
export const MAX_DEVICE_NAME_BYTES = 256;
/** Bounds of each context or parameter map. */
export const MAX_MAP_ENTRIES = 64;
export const MAX_MAP_KEY_BYTES = 320;
export const MAX_MAP_VALUE_BYTES = 4096;
/** Most portals (paths) one device may have. */
export const MAX_PORTALS = 8;

/**
 * volume_context key this plugin adds to the csi/context.ts contract: further portals of the same
 * subsystem, comma-separated `address` or `address:port` (IPv6 as `[address]:port`); each becomes
 * one more path of the controller (multipath).
 */
export const ALTERNATE_PORTALS_KEY = "storage.distort.io/alternatePortals";

/** Prefix of the storage parameters this plugin reads; other keys belong to DPF and are ignored. */
export const PARAM_PREFIX = "storage.distort.io/";

/** storage_parameters keys (StoragePolicy spec.storageParameters). */
export const StorageParameterKeys = {
  ctrlrLossTimeoutSec: `${PARAM_PREFIX}ctrlrLossTimeoutSec`,
  reconnectDelaySec: `${PARAM_PREFIX}reconnectDelaySec`,
  fastIoFailTimeoutSec: `${PARAM_PREFIX}fastIoFailTimeoutSec`,
  multipath: `${PARAM_PREFIX}multipath`,
  dhchapSecretName: `${PARAM_PREFIX}dhchapSecretName`,
  dhchapSecretKey: `${PARAM_PREFIX}dhchapSecretKey`,
  fsType: `${PARAM_PREFIX}fsType`,
} as const;

/** publish_context key DISTORT's ControllerPublishVolume sets: the host NQN the target admits. */
export const PUBLISHED_HOST_NQN_KEY = "storage.distort.io/hostNQN";

/**
 * Reconnect defaults when neither the storage parameters nor the volume context set a value:
 * the Linux initiator's own defaults (ctrl_loss_tmo 600, reconnect_delay 10, fast_io_fail off),
 * so a DPU path rides out the same outages a host path would. SPDK's own defaults (0, 0, 0) give
 * a controller up at its first disconnect.
 */
export const RECONNECT_DEFAULTS = {
  ctrlrLossTimeoutSec: 600,
  reconnectDelaySec: 10,
  fastIoFailTimeoutSec: 0,
};

export type VolumeMode = "Block" | "Filesystem";
export type FsType = "ext4" | "xfs";
export const FS_TYPES: readonly FsType[] = ["ext4", "xfs"];
export type Transport = "tcp" | "rdma";
export type Multipath = "failover" | "multipath";

/** One address of the target subsystem. */
export interface Portal {
  /** IPv4 dotted quad or IPv6 literal, without brackets. */
  readonly address: string;
  readonly port: number;
  readonly adrfam: "ipv4" | "ipv6";
}

/** bdev_nvme reconnect settings, already valid for SPDK. */
export interface ReconnectSettings {
  /** -1: keep trying forever; 0: give the controller up at once. */
  readonly ctrlrLossTimeoutSec: number;
  readonly reconnectDelaySec: number;
  /** 0: off (I/O waits until the controller is back or lost). */
  readonly fastIoFailTimeoutSec: number;
}

/** A validated CreateDevice request. */
export interface DeviceSpec {
  readonly volumeId: string;
  /** Sorted, without duplicates. */
  readonly accessModes: readonly AccessMode[];
  readonly volumeMode: VolumeMode;
  /** True when every access mode is ROX: the filesystem is mounted read-only and never formatted. */
  readonly readonly: boolean;
  readonly target: {
    readonly nqn: string;
    readonly transport: Transport;
    /** The volume context's portal first, then the alternate ones. */
    readonly portals: readonly Portal[];
    /** Namespace UUID or NGUID (lowercase hex, no dashes) the attached bdev must carry. */
    readonly namespaceId?: string;
  };
  readonly reconnect: ReconnectSettings;
  /** Only used with more than one portal. */
  readonly multipath: Multipath;
  readonly dhchap?: { readonly secretName: string; readonly secretKey: string };
  /** The fsType parameter when given; the plugin's default formats a blank volume otherwise. */
  readonly fsType?: FsType;
  /** The host NQN a DISTORT ControllerPublishVolume admitted, when the publish context says. */
  readonly publishedHostNqn?: string;
  readonly publishContext: Readonly<Record<string, string>>;
  readonly volumeContext: Readonly<Record<string, string>>;
  readonly storageParameters: Readonly<Record<string, string>>;
}

/** A validated DeleteDevice or GetDevice request. */
export interface DeviceRef {
  readonly volumeId: string;
  readonly deviceName: string;
}

function invalid(message: string): StorageError {
  return new StorageError("invalid", message);
}

/** True when `s` holds an ASCII control character (C0 or DEL). */
export function hasControlChar(s: string): boolean {
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c < 0x20 || c === 0x7f) return true;
  }
  return false;
}

/** A volume id: 1..256 bytes, no control characters. Pure; throws "invalid". */
export function checkVolumeId(id: string): string {
  if (id.length === 0) throw invalid("volume_id must not be empty");
  const bytes = Buffer.byteLength(id);
  if (bytes > MAX_VOLUME_ID_BYTES)
    throw invalid(`volume_id is ${bytes} bytes, over the ${MAX_VOLUME_ID_BYTES}-byte limit`);
  if (hasControlChar(id)) throw invalid("volume_id must not contain control characters");
  return id;
}

function checkDeviceName(name: string): string {
  if (name.length === 0) throw invalid("device_name must not be empty");
  const bytes = Buffer.byteLength(name);
  if (bytes > MAX_DEVICE_NAME_BYTES)
    throw invalid(`device_name is ${bytes} bytes, over the ${MAX_DEVICE_NAME_BYTES}-byte limit`);
  if (hasControlChar(name)) throw invalid("device_name must not contain control characters");
  return name;
}

function checkMap(field: string, m: Readonly<Record<string, string>>): Record<string, string> {
  const entries = Object.entries(m);
  if (entries.length > MAX_MAP_ENTRIES)
    throw invalid(`${field} has ${entries.length} entries, over the limit of ${MAX_MAP_ENTRIES}`);
  for (const [k, val] of entries) {
    if (k.length === 0) throw invalid(`${field} has an empty key`);
    if (typeof val !== "string") throw invalid(`${field}[${JSON.stringify(k)}] is not a string`);
    if (Buffer.byteLength(k) > MAX_MAP_KEY_BYTES)
      throw invalid(`${field} key ${JSON.stringify(k.slice(0, 40))}... is over ${MAX_MAP_KEY_BYTES} bytes`);
    if (Buffer.byteLength(val) > MAX_MAP_VALUE_BYTES)
      throw invalid(`${field}[${JSON.stringify(k)}] is over ${MAX_MAP_VALUE_BYTES} bytes`);
  }
  return { ...m };
}

const MODE_NAMES: Readonly<Record<number, string>> = {
  [AccessMode.RWO]: "RWO",
  [AccessMode.ROX]: "ROX",
  [AccessMode.RWX]: "RWX",
  [AccessMode.RWOP]: "RWOP",
};

/** "RWO,ROX" for messages. */
export function accessModeNames(modes: readonly AccessMode[]): string {
  return modes.map((m) => MODE_NAMES[m] ?? String(m)).join(",");
}

/** Sorted unique known access modes; "invalid" for none, UNSPECIFIED or a value the API lacks. */
export function parseAccessModes(modes: readonly number[]): AccessMode[] {
  if (modes.length === 0) throw invalid("access_modes must name at least one access mode");
  const out = new Set<AccessMode>();
  for (const m of modes) {
    if (m === AccessMode.UNSPECIFIED)
      throw invalid("access_modes: ACCESS_MODE_UNSPECIFIED is not an access mode");
    if (MODE_NAMES[m] === undefined) throw invalid(`access_modes: unknown access mode ${m}`);
    out.add(m as AccessMode);
  }
  return [...out].sort((a, b) => a - b);
}

/** "Filesystem" (also for the empty string, the API's default) or "Block"; case as Kubernetes spells it. */
export function parseVolumeMode(mode: string): VolumeMode {
  if (mode === "" || mode === "Filesystem") return "Filesystem";
  if (mode === "Block") return "Block";
  throw invalid(`volume_mode must be "Filesystem" or "Block", got ${JSON.stringify(mode.slice(0, 64))}`);
}

const IP = v.pipe(v.string(), v.ip());

/** `addr`, `addr:port`, `[v6]` or `[v6]:port` with `defaultPort`; "invalid" otherwise. */
export function parsePortal(text: string, defaultPort: number): Portal {
  const s = text.trim();
  let address: string;
  let port: string | undefined;
  const bracketed = /^\[([^\]]+)\](?::(\d+))?$/.exec(s);
  if (bracketed) {
    address = bracketed[1] as string;
    port = bracketed[2];
  } else if (s.split(":").length === 2) {
    [address, port] = s.split(":") as [string, string];
  } else {
    address = s;
  }
  if (!v.is(IP, address))
    throw invalid(`${ALTERNATE_PORTALS_KEY}: ${JSON.stringify(s)} is not an IP address`);
  let p = defaultPort;
  if (port !== undefined) {
    if (!/^\d{1,5}$/.test(port) || Number(port) < 1 || Number(port) > 65535)
      throw invalid(`${ALTERNATE_PORTALS_KEY}: port of ${JSON.stringify(s)} must be 1..65535`);
    p = Number(port);
  }
  return { address, port: p, adrfam: address.includes(":") ? "ipv6" : "ipv4" };
}

function portalKey(p: Portal): string {
  return `${p.address.toLowerCase()}|${p.port}`;
}

/** Which of the context's reconnect keys map to which SPDK setting. */
const CONTEXT_RECONNECT = [
  [VolumeContextKeys.ctrlLossTmo, "ctrlrLossTimeoutSec"],
  [VolumeContextKeys.reconnectDelay, "reconnectDelaySec"],
  [VolumeContextKeys.fastIoFailTmo, "fastIoFailTimeoutSec"],
] as const;

/** The DISTORT volume context: target NQN, portals, transport, namespace id, reconnect hints. */
function parseVolumeContext(ctx: Readonly<Record<string, string>>) {
  for (const k of [
    VolumeContextKeys.nqn,
    VolumeContextKeys.portalIP,
    VolumeContextKeys.portalPort,
    VolumeContextKeys.transport,
  ]) {
    if (ctx[k] === undefined) throw invalid(`volume_context lacks ${k} (is this a DISTORT volume?)`);
  }
  const r = v.safeParse(VolumeContextSchema, ctx);
  if (!r.success) {
    const issue = r.issues[0];
    throw invalid(`volume_context: ${v.getDotPath(issue) ?? ""}: ${issue.message}`);
  }
  const c = r.output;
  const nqn = c[VolumeContextKeys.nqn];
  const problem = nqnProblem(nqn);
  if (problem !== undefined) throw invalid(`volume_context ${VolumeContextKeys.nqn}: ${problem}`);
  const port = c[VolumeContextKeys.portalPort];
  const primary = parsePortal(c[VolumeContextKeys.portalIP], port);
  const portals = [primary];
  const alt = ctx[ALTERNATE_PORTALS_KEY];
  if (alt !== undefined) {
    for (const part of alt.split(",")) {
      if (part.trim() === "") throw invalid(`${ALTERNATE_PORTALS_KEY} has an empty entry`);
      const p = parsePortal(part, port);
      if (portals.some((q) => portalKey(q) === portalKey(p)))
        throw invalid(`${ALTERNATE_PORTALS_KEY}: portal ${part.trim()} is listed twice`);
      portals.push(p);
    }
  }
  // The CSI controller's own list (every listener the storage node reported, the primary
  // included): each one not yet listed is one more path.
  for (const q of c[VolumeContextKeys.portals] ?? []) {
    const p = parsePortal(
      q.address.includes(":") ? `[${q.address}]:${q.port}` : `${q.address}:${q.port}`,
      port,
    );
    if (!portals.some((x) => portalKey(x) === portalKey(p))) portals.push(p);
  }
  if (portals.length > MAX_PORTALS)
    throw invalid(`at most ${MAX_PORTALS} portals per volume, got ${portals.length}`);
  let namespaceId: string | undefined;
  const nsId = c[VolumeContextKeys.namespaceUUID];
  if (nsId !== undefined && nsId !== "") {
    const hex = nsId.replace(/-/g, "").toLowerCase();
    if (!/^[0-9a-f]{32}$/.test(hex))
      throw invalid(`volume_context ${VolumeContextKeys.namespaceUUID} must be a UUID or a 32-digit NGUID`);
    namespaceId = hex;
  }
  // The context speaks nvme-cli (kernel initiator): fast_io_fail_tmo -1 is "off", SPDK's 0.
  const hints: Partial<Record<keyof ReconnectSettings, number>> = {};
  for (const [key, field] of CONTEXT_RECONNECT) {
    const val = c[key];
    if (val !== undefined) hints[field] = field === "fastIoFailTimeoutSec" && val === -1 ? 0 : val;
  }
  return { nqn, transport: c[VolumeContextKeys.transport], portals, namespaceId, hints };
}

function intParam(key: string, raw: string, min: number, max: number): number {
  if (!/^-?\d{1,10}$/.test(raw))
    throw invalid(`storage parameter ${key} must be a whole number, got ${JSON.stringify(raw)}`);
  const n = Number(raw);
  if (n < min || n > max) throw invalid(`storage parameter ${key} must be ${min}..${max}, got ${n}`);
  return n;
}

const SECRET_NAME = /^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$/;
const SECRET_KEY = /^[-._a-zA-Z0-9]+$/;

/** The storage parameters this plugin reads; unknown `storage.distort.io/` keys are refused. */
function parseStorageParameters(params: Readonly<Record<string, string>>) {
  const known = new Set<string>(Object.values(StorageParameterKeys));
  const unknown = Object.keys(params)
    .filter((k) => k.startsWith(PARAM_PREFIX) && !known.has(k))
    .sort();
  if (unknown.length > 0) {
    throw invalid(
      `unknown storage parameter${unknown.length > 1 ? "s" : ""} ${unknown.map((k) => JSON.stringify(k)).join(", ")} (this plugin understands: ${[...known].join(", ")})`,
    );
  }
  const K = StorageParameterKeys;
  const reconnect: Partial<Record<keyof ReconnectSettings, number>> = {};
  const loss = params[K.ctrlrLossTimeoutSec];
  if (loss !== undefined)
    reconnect.ctrlrLossTimeoutSec = intParam(K.ctrlrLossTimeoutSec, loss, -1, 2_147_483_647);
  const delay = params[K.reconnectDelaySec];
  if (delay !== undefined) reconnect.reconnectDelaySec = intParam(K.reconnectDelaySec, delay, 0, 86_400);
  const fast = params[K.fastIoFailTimeoutSec];
  if (fast !== undefined)
    reconnect.fastIoFailTimeoutSec = intParam(K.fastIoFailTimeoutSec, fast, 0, 2_147_483_647);

  let multipath: Multipath = "multipath";
  const mp = params[K.multipath];
  if (mp !== undefined) {
    if (mp !== "failover" && mp !== "multipath")
      throw invalid(
        `storage parameter ${K.multipath} must be "failover" or "multipath", got ${JSON.stringify(mp)}`,
      );
    multipath = mp;
  }

  let dhchap: DeviceSpec["dhchap"];
  const secretName = params[K.dhchapSecretName];
  const secretKey = params[K.dhchapSecretKey];
  if (secretName !== undefined || secretKey !== undefined) {
    if (secretName === undefined)
      throw invalid(`storage parameter ${K.dhchapSecretKey} needs ${K.dhchapSecretName}`);
    if (secretKey === undefined)
      throw invalid(`storage parameter ${K.dhchapSecretName} needs ${K.dhchapSecretKey}`);
    if (!SECRET_NAME.test(secretName) || secretName.length > 253)
      throw invalid(
        `storage parameter ${K.dhchapSecretName} must be a Secret name, got ${JSON.stringify(secretName)}`,
      );
    if (!SECRET_KEY.test(secretKey) || secretKey.length > 253)
      throw invalid(
        `storage parameter ${K.dhchapSecretKey} must be a Secret data key, got ${JSON.stringify(secretKey)}`,
      );
    dhchap = { secretName, secretKey };
  }

  let fsType: FsType | undefined;
  const fs = params[K.fsType];
  if (fs !== undefined) {
    if (!FS_TYPES.includes(fs as FsType))
      throw invalid(
        `storage parameter ${K.fsType} must be one of ${FS_TYPES.join(", ")}, got ${JSON.stringify(fs)}`,
      );
    fsType = fs as FsType;
  }
  return { reconnect, multipath, dhchap, fsType };
}

/**
 * SPDK's bdev_nvme_check_io_error_resiliency_params, as a reason or undefined. Pure. SPDK answers
 * a violation with a bare "Invalid argument"; checking here names the rule.
 */
export function reconnectProblem(r: ReconnectSettings): string | undefined {
  const { ctrlrLossTimeoutSec: loss, reconnectDelaySec: delay, fastIoFailTimeoutSec: fast } = r;
  if (loss < -1) return `ctrlr_loss_timeout_sec must be >= -1, got ${loss}`;
  if (loss === 0) {
    if (delay !== 0 || fast !== 0)
      return `with ctrlr_loss_timeout_sec 0 (no reconnect), reconnect_delay_sec and fast_io_fail_timeout_sec must be 0 (got ${delay} and ${fast})`;
    return undefined;
  }
  if (delay === 0) return `ctrlr_loss_timeout_sec ${loss} needs a reconnect_delay_sec above 0`;
  if (loss !== -1 && delay > loss)
    return `reconnect_delay_sec ${delay} must not exceed ctrlr_loss_timeout_sec ${loss}`;
  if (fast !== 0 && fast < delay)
    return `fast_io_fail_timeout_sec ${fast} must be 0 (off) or >= reconnect_delay_sec ${delay}`;
  if (fast !== 0 && loss !== -1 && fast > loss)
    return `fast_io_fail_timeout_sec ${fast} must not exceed ctrlr_loss_timeout_sec ${loss}`;
  return undefined;
}

/**
 * Resolves each setting from the storage parameters, else the volume context, else the defaults;
 * defaults bend to explicit values (no reconnect when the loss timeout is 0, a delay no longer
 * than the loss timeout), explicit values never do. Pure; "invalid" for a combination SPDK refuses.
 */
export function resolveReconnect(
  params: Partial<Record<keyof ReconnectSettings, number>>,
  context: Partial<Record<keyof ReconnectSettings, number>>,
): ReconnectSettings {
  const loss =
    params.ctrlrLossTimeoutSec ?? context.ctrlrLossTimeoutSec ?? RECONNECT_DEFAULTS.ctrlrLossTimeoutSec;
  const explicitDelay = params.reconnectDelaySec ?? context.reconnectDelaySec;
  const explicitFast = params.fastIoFailTimeoutSec ?? context.fastIoFailTimeoutSec;
  let delay = explicitDelay ?? RECONNECT_DEFAULTS.reconnectDelaySec;
  if (explicitDelay === undefined && loss === 0) delay = 0;
  else if (explicitDelay === undefined && loss > 0) delay = Math.min(delay, loss);
  let fast = explicitFast ?? RECONNECT_DEFAULTS.fastIoFailTimeoutSec;
  if (explicitFast === undefined && loss === 0) fast = 0;
  const r = { ctrlrLossTimeoutSec: loss, reconnectDelaySec: delay, fastIoFailTimeoutSec: fast };
  const problem = reconnectProblem(r);
  if (problem !== undefined) throw invalid(`reconnect settings: ${problem}`);
  return r;
}

/** The CreateDevice fields, as the generated message carries them. */
export interface CreateDeviceInput {
  volumeId: string;
  accessModes: readonly number[];
  volumeMode: string;
  publishContext: Readonly<Record<string, string>>;
  volumeContext: Readonly<Record<string, string>>;
  storageParameters: Readonly<Record<string, string>>;
}

/** Validates a CreateDevice request. Pure; throws StorageError "invalid" naming the field. */
export function parseCreateDevice(req: CreateDeviceInput): DeviceSpec {
  const volumeId = checkVolumeId(req.volumeId);
  const accessModes = parseAccessModes(req.accessModes);
  const volumeMode = parseVolumeMode(req.volumeMode);
  const publishContext = checkMap("publish_context", req.publishContext);
  const volumeContext = checkMap("volume_context", req.volumeContext);
  const storageParameters = checkMap("storage_parameters", req.storageParameters);
  if (volumeMode === "Filesystem" && accessModes.includes(AccessMode.RWX)) {
    throw invalid(
      "access mode RWX is not offered for Filesystem volumes: the DPU mounts a local filesystem (ext4/xfs) that only one node may write; use volume_mode Block",
    );
  }
  const ctx = parseVolumeContext(volumeContext);
  const params = parseStorageParameters(storageParameters);
  const reconnect = resolveReconnect(params.reconnect, ctx.hints);
  let publishedHostNqn: string | undefined;
  const published = publishContext[PUBLISHED_HOST_NQN_KEY];
  if (published !== undefined) {
    const problem = nqnProblem(published);
    if (problem !== undefined) throw invalid(`publish_context ${PUBLISHED_HOST_NQN_KEY}: ${problem}`);
    publishedHostNqn = published;
  }
  return {
    volumeId,
    accessModes,
    volumeMode,
    readonly: accessModes.every((m) => m === AccessMode.ROX),
    target: {
      nqn: ctx.nqn,
      transport: ctx.transport,
      portals: ctx.portals,
      ...(ctx.namespaceId === undefined ? {} : { namespaceId: ctx.namespaceId }),
    },
    reconnect,
    multipath: params.multipath,
    ...(params.dhchap ? { dhchap: params.dhchap } : {}),
    ...(params.fsType ? { fsType: params.fsType } : {}),
    ...(publishedHostNqn === undefined ? {} : { publishedHostNqn }),
    publishContext,
    volumeContext,
    storageParameters,
  };
}

/** Validates DeleteDevice and GetDevice requests. Pure. */
export function parseDeviceRef(req: { volumeId: string; deviceName: string }): DeviceRef {
  return { volumeId: checkVolumeId(req.volumeId), deviceName: checkDeviceName(req.deviceName) };
}

/** Validates ListDevices' max_entries (0: no limit). The token is checked by the pager. Pure. */
export function parseMaxEntries(maxEntries: number): number {
  if (!Number.isInteger(maxEntries) || maxEntries < 0)
    throw invalid(`max_entries must not be negative, got ${maxEntries}`);
  return maxEntries;
}
