// The imperative shell of the plugin: creates, deletes, describes and lists devices by driving
// SNAP (one persistent SPDK JSON-RPC connection), the DPU's block devices and filesystems, the
// DH-HMAC-CHAP key files and the device records. Every step looks before it acts, so a call
// repeated after a timeout or a crash at any point continues where the last one stopped.

import { errorMessage, StorageError } from "../../lib/errors.ts";
import type { KeyFiles } from "../../lib/key-files.ts";
import { type Page, paginate } from "../../lib/keyset-pagination.ts";
import type { SecretReader } from "../../lib/kube/secrets.ts";
import type { Logger } from "../../lib/log.ts";
import { SpdkError } from "../../lib/spdk/errors.ts";
import type { SpdkMethods } from "../../lib/spdk/methods.ts";
import type { Bdev, NvmeController } from "../../lib/spdk/schemas.ts";
import type { SnapRpc } from "../snap/snap-rpc.ts";
import type { BlockDevices } from "./block-devices.ts";
import type { HostFilesystem, MountEntry } from "./host-filesystem.ts";
import { type DeviceNames, mountDirFor, namesFor } from "./names.ts";
import {
  type AttachContext,
  attachParamsFor,
  controllerConflict,
  missingPortals,
  planFilesystem,
  recordMismatch,
  type TrtypeMap,
} from "./plan.ts";
import type { DeviceRef, DeviceSpec, FsType, Portal } from "./request.ts";
import type { DeviceRecord, DeviceStore } from "./state-store.ts";

/** A DH-HMAC-CHAP secret as nvme-cli and SPDK take it: DHHC-1:<hash id>:<base64 key + CRC>: */
const DHCHAP_SECRET = /^DHHC-1:0[0-3]:[A-Za-z0-9+/]{44,}={0,2}:$/;
/** How long CreateDevice waits for namespace 1's bdev after the controller is attached. */
const BDEV_WAIT_MS = 5000;

export interface DeviceManagerOptions {
  methods: SpdkMethods;
  snap: SnapRpc;
  store: DeviceStore;
  /** Where DH-HMAC-CHAP secrets are written for SNAP's file keyring (a directory SNAP sees at the same path). */
  keyFiles: KeyFiles;
  /** Reads the Secrets that storage parameters name; undefined when the plugin has no Kubernetes access. */
  secrets?: SecretReader;
  /** Namespace of those Secrets (the plugin's own). */
  secretNamespace: string;
  blockDevices: BlockDevices;
  filesystem: HostFilesystem;
  /** Directory under which Filesystem volumes are mounted (SNAP must see it at the same path). */
  mountRoot: string;
  hostNqn: string;
  trtypes: TrtypeMap;
  defaultFsType: FsType;
  logger: Logger;
  now?: () => Date;
}

/** What GetDevice reports. */
export interface DeviceInfo {
  readonly volumeId: string;
  readonly deviceName: string;
  readonly accessModes: readonly number[];
  readonly volumeMode: string;
  readonly publishContext: Readonly<Record<string, string>>;
  readonly volumeContext: Readonly<Record<string, string>>;
  readonly storageParameters: Readonly<Record<string, string>>;
}

/** One picture of what SNAP and the DPU hold, taken once per Get/List call. */
interface Observed {
  readonly bdevs: ReadonlyMap<string, Bdev>;
  /** undefined when SNAP cannot list fsdevs. */
  readonly fsdevs: ReadonlyMap<string, string | undefined> | undefined;
  readonly mounts: readonly MountEntry[];
}

function isKind(err: unknown, ...kinds: string[]): boolean {
  return err instanceof StorageError && kinds.includes(err.kind);
}

function addr(p: Portal): string {
  return p.adrfam === "ipv6" ? `[${p.address}]:${p.port}` : `${p.address}:${p.port}`;
}

function hexId(s: string): string {
  return s.replace(/-/g, "").toLowerCase();
}

/**
 * Devices of DISTORT volumes in SNAP.
 *
 * Concurrency: one call at a time per volume id; a call for a volume that is busy fails at once
 * with "busy" (ABORTED) instead of queueing behind a long attach or mkfs, and the caller retries.
 * Calls for different volumes run concurrently. Errors are StorageError kinds that
 * lib/grpc/status.ts maps to gRPC codes.
 */
export class DeviceManager {
  readonly #o: DeviceManagerOptions;
  readonly #log: Logger;
  readonly #busy = new Set<string>();
  readonly #now: () => Date;

  constructor(o: DeviceManagerOptions) {
    this.#o = o;
    this.#log = o.logger.with({ component: "devices" });
    this.#now = o.now ?? (() => new Date());
  }

  async #exclusive<T>(volumeId: string, what: string, fn: () => Promise<T>): Promise<T> {
    if (this.#busy.has(volumeId)) {
      throw new StorageError(
        "busy",
        `another call for volume ${volumeId} is in progress; retry ${what} later`,
      );
    }
    this.#busy.add(volumeId);
    try {
      return await fn();
    } finally {
      this.#busy.delete(volumeId);
    }
  }

  /**
   * CreateDevice: returns the SNAP device name (the bdev for Block, the fsdev for Filesystem).
   * Idempotent on the volume id: a device with the same access modes, volume mode and subsystem
   * is returned as it is (repaired first if SNAP lost part of it); one with other values is
   * "already-exists". Errors: "precondition" when the target refuses this DPU's host NQN, the
   * volume is published to another host, the Secret is missing or the content forbids mounting;
   * "unavailable" when nothing answers at the portals; "busy" while another call runs for it.
   */
  create(spec: DeviceSpec): Promise<string> {
    return this.#exclusive(spec.volumeId, "CreateDevice", () => this.#create(spec));
  }

  async #create(spec: DeviceSpec): Promise<string> {
    const names = namesFor(spec.volumeId);
    const deviceName = spec.volumeMode === "Block" ? names.bdev : names.fsdev;
    const log = this.#log.with({ volume: spec.volumeId, device: deviceName, nqn: spec.target.nqn });
    if (spec.publishedHostNqn !== undefined && spec.publishedHostNqn !== this.#o.hostNqn) {
      throw new StorageError(
        "precondition",
        `volume ${spec.volumeId} is published to host ${spec.publishedHostNqn}, but this DPU connects as ${this.#o.hostNqn}: the target would refuse it (publish the volume to this DPU's node, or set the plugin's host NQN)`,
      );
    }
    const existing = await this.#o.store.get(spec.volumeId);
    if (existing) {
      const mismatch = recordMismatch(existing, spec);
      if (mismatch) throw new StorageError("already-exists", mismatch);
      if (existing.phase === "ready") {
        const why = this.#absence(existing, await this.#observe());
        if (why === undefined) {
          // Whole: a path that was down last time is added now, best effort; the device is
          // returned either way, since it works.
          const ctx = this.#attachContext(names, spec.dhchap ? names.key : undefined);
          await this.#attach(spec, ctx, log).catch((err) =>
            log.warn("missing paths not added", { err: errorMessage(err) }),
          );
          return existing.deviceName;
        }
        log.warn("device recorded but incomplete in SNAP; repairing", { reason: why });
      }
    }
    const now = this.#now().toISOString();
    const record: DeviceRecord = {
      version: 1,
      volumeId: spec.volumeId,
      deviceName,
      phase: "creating",
      accessModes: [...spec.accessModes],
      volumeMode: spec.volumeMode,
      nqn: spec.target.nqn,
      publishContext: { ...spec.publishContext },
      volumeContext: { ...spec.volumeContext },
      storageParameters: { ...spec.storageParameters },
      createdAt: existing?.createdAt ?? now,
      updatedAt: now,
    };
    // Written before SNAP changes: a crash from here on leaves a record that DeleteDevice and a
    // retried CreateDevice both find.
    await this.#o.store.put(record);

    const dhchapKey = spec.dhchap ? await this.#installKey(spec, names) : undefined;
    await this.#attach(spec, this.#attachContext(names, dhchapKey), log);
    await this.#checkBdev(spec, names, log);
    if (spec.volumeMode === "Filesystem") await this.#ensureFilesystem(spec, names, log);

    await this.#o.store.put({ ...record, phase: "ready", updatedAt: this.#now().toISOString() });
    log.info("device ready", { mode: spec.volumeMode, portals: spec.target.portals.map(addr) });
    return deviceName;
  }

  #attachContext(names: DeviceNames, dhchapKey: string | undefined): AttachContext {
    return { names, hostNqn: this.#o.hostNqn, trtypes: this.#o.trtypes, ...(dhchapKey ? { dhchapKey } : {}) };
  }

  async #installKey(spec: DeviceSpec, names: DeviceNames): Promise<string> {
    const ref = spec.dhchap as NonNullable<DeviceSpec["dhchap"]>;
    const ns = this.#o.secretNamespace;
    if (!this.#o.secrets) {
      throw new StorageError(
        "precondition",
        `volume ${spec.volumeId} asks for DH-HMAC-CHAP (Secret ${ns}/${ref.secretName}), but this plugin has no Kubernetes access to read Secrets`,
      );
    }
    const value = (await this.#o.secrets.read(ns, ref.secretName, ref.secretKey))?.trim();
    if (value === undefined) {
      throw new StorageError(
        "precondition",
        `Secret ${ns}/${ref.secretName} has no key ${ref.secretKey} (DH-HMAC-CHAP secret)`,
      );
    }
    if (!DHCHAP_SECRET.test(value)) {
      throw new StorageError(
        "precondition",
        `Secret ${ns}/${ref.secretName} key ${ref.secretKey} is not a DH-HMAC-CHAP secret (DHHC-1:<hash>:<base64>:)`,
      );
    }
    let loaded: boolean;
    try {
      loaded = (await this.#o.methods.keyringGetKeys()).some((k) => k.name === names.key);
    } catch (err) {
      if (isKind(err, "unimplemented")) {
        throw new StorageError(
          "precondition",
          "this SNAP has no keyring (keyring_get_keys is missing; SPDK gained it in v24.05): DH-HMAC-CHAP volumes cannot be attached",
          { cause: err },
        );
      }
      throw err;
    }
    // Rewritten on every call: a rotated Secret reaches the file the keyring reads from.
    const path = await this.#o.keyFiles.write(names.key, value);
    if (!loaded) {
      try {
        await this.#o.methods.keyringFileAddKey({ name: names.key, path });
      } catch (err) {
        if (!isKind(err, "already-exists")) throw err;
      }
    }
    return names.key;
  }

  async #attach(spec: DeviceSpec, ctx: AttachContext, log: Logger): Promise<void> {
    const controllers = await this.#o.methods.bdevNvmeGetControllers();
    const conflict = controllerConflict(spec, ctx, controllers);
    if (conflict) throw new StorageError("precondition", conflict);
    const ours: NvmeController | undefined = controllers.find((c) => c.name === ctx.names.controller);
    const missing = new Set(missingPortals(spec, ours).map(addr));
    const params = attachParamsFor(spec, ctx);
    let firstError: unknown;
    for (const [i, p] of params.entries()) {
      const portal = spec.target.portals[i] as Portal;
      if (!missing.has(addr(portal))) continue;
      try {
        await this.#o.methods.bdevNvmeAttachController(p);
        log.info("path attached", { portal: addr(portal), trtype: p.trtype, adrfam: p.adrfam });
      } catch (err) {
        // -114: the path exists already (an earlier attempt completed after its caller gave up).
        if (isKind(err, "already-exists")) continue;
        const e = this.#explainAttach(err, spec, portal);
        log.warn("path not attached", { portal: addr(portal), err: errorMessage(e) });
        firstError ??= e;
      }
    }
    if (firstError === undefined) return;
    // One working path keeps the volume usable; the next CreateDevice retries the others.
    const now = await this.#o.methods.bdevNvmeGetControllers();
    if (now.some((c) => c.name === ctx.names.controller && c.ctrlrs.length > 0)) return;
    throw firstError;
  }

  #explainAttach(err: unknown, spec: DeviceSpec, portal: Portal): unknown {
    if (!(err instanceof SpdkError)) return err;
    if (err.kind === "precondition") {
      const auth = spec.dhchap ? " or DH-HMAC-CHAP authentication failed" : "";
      return new StorageError(
        "precondition",
        `target ${addr(portal)} refused host ${this.#o.hostNqn} for ${spec.target.nqn}: the host NQN is not allowed on the subsystem (is the volume published to this DPU?)${auth}`,
        { cause: err },
      );
    }
    if (err.kind === "unavailable") {
      return new StorageError(
        "unavailable",
        `nothing serves ${spec.target.nqn} at ${spec.target.transport} ${addr(portal)}`,
        {
          cause: err,
        },
      );
    }
    return err;
  }

  async #checkBdev(spec: DeviceSpec, names: DeviceNames, log: Logger): Promise<Bdev> {
    let bdev: Bdev | undefined;
    try {
      [bdev] = await this.#o.methods.bdevGetBdevs({ name: names.bdev, timeout: BDEV_WAIT_MS });
    } catch (err) {
      if (!isKind(err, "not-found", "timeout")) throw err;
    }
    if (!bdev) {
      throw new StorageError(
        "unavailable",
        `controller ${names.controller} is attached but ${spec.target.nqn} shows no namespace 1 (bdev ${names.bdev}) yet`,
      );
    }
    const want = spec.target.namespaceId;
    if (want !== undefined) {
      const ids = [bdev.uuid, ...bdev.aliases].filter((x): x is string => x !== undefined).map(hexId);
      if (!ids.includes(want)) {
        // Another namespace answers under this NQN: never hand it to the host as this volume.
        log.error("namespace identity mismatch; detaching", { want, have: ids });
        await this.#detach(names);
        throw new StorageError(
          "precondition",
          `${spec.target.nqn} namespace 1 is ${bdev.uuid ?? "unidentified"}, not the volume's ${want}; detached again`,
        );
      }
    }
    return bdev;
  }

  async #ensureFilesystem(spec: DeviceSpec, names: DeviceNames, log: Logger): Promise<void> {
    const fs = this.#o.filesystem;
    const dir = mountDirFor(this.#o.mountRoot, names);
    const device = await this.#o.blockDevices.export(names.bdev);
    await fs.ensureDir(dir);
    let top = topMount(await fs.mounts(), dir);
    if (top && top.source !== device) {
      // Our private directory holds a mount of an export that no longer exists (SNAP restarted
      // and the bdev came back on another device): drop it before mounting the live one.
      log.warn("stale mount replaced", { dir, was: top.source, now: device });
      await fs.unmount(dir);
      top = topMount(await fs.mounts(), dir);
      if (top) throw new StorageError("precondition", `${dir} still has ${top.source} mounted`);
    }
    if (!top) {
      const plan = planFilesystem(await fs.probe(device), {
        ...(spec.fsType ? { fsType: spec.fsType } : {}),
        defaultFsType: this.#o.defaultFsType,
        readonly: spec.readonly,
        volumeId: spec.volumeId,
      });
      if (plan.format) {
        log.info("formatting", { device, fsType: plan.format });
        await fs.format(device, plan.format);
      }
      await fs.mount(device, dir, plan.mountAs, spec.readonly);
      log.info("mounted", { device, dir, fsType: plan.mountAs, readonly: spec.readonly });
    }
    const fsdevs = await this.#o.snap.fsdevGetFsdevs();
    const have = fsdevs?.find((f) => f.name === names.fsdev);
    if (have) {
      const root = have.module_specific?.root_path;
      if (root !== undefined && root !== dir) {
        throw new StorageError(
          "precondition",
          `SNAP fsdev ${names.fsdev} serves ${root}, not ${dir}; DeleteDevice it first`,
        );
      }
      return;
    }
    try {
      await this.#o.methods.fsdevAioCreate({ name: names.fsdev, root_path: dir });
    } catch (err) {
      if (!isKind(err, "already-exists")) throw err;
    }
  }

  /**
   * DeleteDevice: removes the fsdev, unmounts, ends the block export, detaches the controller,
   * removes the key, then forgets the record. Works from the volume id alone (names are derived
   * from it), so it also cleans up after a lost record. A device name that is not this volume's
   * names nothing to delete: OK without changes. Idempotent. "precondition" while SNAP still uses
   * the bdev (it is claimed), so a host never loses a disk it still sees.
   */
  delete(ref: DeviceRef): Promise<void> {
    return this.#exclusive(ref.volumeId, "DeleteDevice", () => this.#delete(ref));
  }

  async #delete(ref: DeviceRef): Promise<void> {
    const names = namesFor(ref.volumeId);
    const log = this.#log.with({ volume: ref.volumeId, device: ref.deviceName });
    const record = await this.#o.store.get(ref.volumeId);
    const ownName = record ? record.deviceName : undefined;
    if (ref.deviceName !== names.bdev && ref.deviceName !== names.fsdev) {
      log.warn("DeleteDevice for a name that is not this volume's device; nothing to do", {
        expected: ownName ?? `${names.bdev} or ${names.fsdev}`,
      });
      return;
    }
    if (ownName !== undefined && ownName !== ref.deviceName) {
      log.warn("DeleteDevice names the volume's other-mode device; nothing to do", { recorded: ownName });
      return;
    }
    const m = this.#o.methods;
    try {
      await m.fsdevAioDelete(names.fsdev);
    } catch (err) {
      if (!isKind(err, "not-found", "unimplemented")) throw err;
    }
    const dir = mountDirFor(this.#o.mountRoot, names);
    // Stacked mounts (a repair mounted over a stale one) come off one by one; bounded, in case
    // the table keeps showing a mount that umount cannot remove.
    for (let i = 0; i < 8 && topMount(await this.#o.filesystem.mounts(), dir); i++) {
      await this.#o.filesystem.unmount(dir);
    }
    const left = topMount(await this.#o.filesystem.mounts(), dir);
    if (left) throw new StorageError("internal", `${dir} still has ${left.source} mounted after 8 unmounts`);
    await this.#o.filesystem.removeDir(dir);
    await this.#o.blockDevices.unexport(names.bdev);
    const [bdev] = await m.bdevGetBdevs({ name: names.bdev }).catch((err) => {
      if (isKind(err, "not-found")) return [];
      throw err;
    });
    if (bdev?.claimed) {
      throw new StorageError(
        "precondition",
        `bdev ${names.bdev} is still in use in SNAP (claimed${bdev.claim_type ? `: ${bdev.claim_type}` : ""}); remove it from SNAP before DeleteDevice`,
      );
    }
    await this.#detach(names);
    try {
      await m.keyringFileRemoveKey(names.key);
    } catch (err) {
      if (!isKind(err, "not-found", "unimplemented")) throw err;
    }
    await this.#o.keyFiles.remove(names.key);
    await this.#o.store.delete(ref.volumeId);
    log.info("device deleted");
  }

  async #detach(names: DeviceNames): Promise<void> {
    try {
      await this.#o.methods.bdevNvmeDetachController(names.controller);
    } catch (err) {
      if (!isKind(err, "not-found")) throw err;
    }
  }

  /**
   * GetDevice: the saved request of a device that is complete in SNAP now. "not-found" when the
   * volume has no device by that name, creation has not finished, or SNAP lost it (a retried
   * CreateDevice repairs it).
   */
  async get(ref: DeviceRef): Promise<DeviceInfo> {
    const record = await this.#o.store.get(ref.volumeId);
    if (!record || record.deviceName !== ref.deviceName) {
      throw new StorageError("not-found", `volume ${ref.volumeId} has no device ${ref.deviceName}`);
    }
    if (record.phase !== "ready") {
      throw new StorageError(
        "not-found",
        `device ${ref.deviceName} of volume ${ref.volumeId} is still being created`,
      );
    }
    const why = this.#absence(record, await this.#observe());
    if (why !== undefined) {
      throw new StorageError(
        "not-found",
        `device ${ref.deviceName} of volume ${ref.volumeId} is gone from SNAP: ${why}`,
      );
    }
    return infoOf(record);
  }

  /** ListDevices: complete devices, by volume id, one page; a token not issued here is "busy" (ABORTED). */
  async list(maxEntries: number, startingToken: string): Promise<Page<DeviceInfo>> {
    const records = (await this.#o.store.list()).filter((r) => r.phase === "ready");
    const observed = records.length > 0 ? await this.#observe() : undefined;
    const live = records.filter((r) => observed !== undefined && this.#absence(r, observed) === undefined);
    return paginate(live.map(infoOf), (d) => d.volumeId, maxEntries, startingToken);
  }

  async #observe(): Promise<Observed> {
    const [bdevs, fsdevs, mounts] = await Promise.all([
      this.#o.methods.bdevGetBdevs(),
      this.#o.snap.fsdevGetFsdevs(),
      this.#o.filesystem.mounts(),
    ]);
    return {
      bdevs: new Map(bdevs.map((b) => [b.name, b])),
      fsdevs: fsdevs && new Map(fsdevs.map((f) => [f.name, f.module_specific?.root_path])),
      mounts,
    };
  }

  /** Why a ready record's device is not whole in SNAP, or undefined when it is. */
  #absence(record: DeviceRecord, o: Observed): string | undefined {
    const names = namesFor(record.volumeId);
    if (!o.bdevs.has(names.bdev)) return `bdev ${names.bdev} is missing`;
    if (record.volumeMode === "Block") return undefined;
    const dir = mountDirFor(this.#o.mountRoot, names);
    if (!topMount(o.mounts, dir)) return `nothing is mounted on ${dir}`;
    if (o.fsdevs !== undefined && !o.fsdevs.has(names.fsdev)) return `fsdev ${names.fsdev} is missing`;
    return undefined;
  }
}

/** The visible (last) mount on `dir`, if any. */
function topMount(mounts: readonly MountEntry[], dir: string): MountEntry | undefined {
  return mounts.filter((m) => m.mountPoint === dir).at(-1);
}

function infoOf(r: DeviceRecord): DeviceInfo {
  return {
    volumeId: r.volumeId,
    deviceName: r.deviceName,
    accessModes: r.accessModes,
    volumeMode: r.volumeMode,
    publishContext: r.publishContext,
    volumeContext: r.volumeContext,
    storageParameters: r.storageParameters,
  };
}
