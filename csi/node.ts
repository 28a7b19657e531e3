// The CSI Node service: stage (NVMe-oF connect, find the namespace, format if blank, mount),
// publish (bind mounts), unpublish, unstage (unmount, disconnect), node info and capabilities,
// volume stats, volume health and online expansion. Host effects go through the ports in NodeDeps.
import type { HandlerContext, ServiceImpl } from "@connectrpc/connect";
import {
  type Node,
  NodeServiceCapability_RPC_Type as RpcType,
  VolumeHealthErrorType,
  VolumeUsage_Unit,
} from "../gen/csi/v1/csi_pb.ts";
import type { Clock } from "../lib/clock.ts";
import { InFlight } from "../lib/concurrency/in-flight.ts";
import { errorMessage, StorageError } from "../lib/errors.ts";
import type { HostFs } from "../lib/fs.ts";
import type { Logger } from "../lib/log.ts";
import { parseMkfsOptions } from "../lib/mkfs-options.ts";
import { hostKeyPairFrom, hostPskFrom } from "../lib/nvme/dhchap-keys.ts";
import { externalIdFor, nqnFor } from "../lib/volume-identity.ts";
import { parseVolumeId } from "./controller/volume-id.ts";
import { alreadyExists, failedPrecondition, invalidArgument, notFound } from "./errors.ts";
import type { FsType, Mounter } from "./host/mounter.ts";
import type { MountEntry } from "./host/mountinfo.ts";
import type { ConnectSecrets, NvmeInitiator } from "./host/nvme-initiator.ts";
import { assessHealth, type HealthIssue, type MountObservation } from "./node/health.ts";
import type { NodeStateStore, Publication, StagedVolume } from "./node/state-store.ts";
import {
  isReaderMode,
  parseCapability,
  parseStageContexts,
  requireVolumeId,
  sameAccess,
  type VolumeAccess,
} from "./node/validate.ts";
import { statsWithCondition, VOLUME_CONDITION_RPC } from "./node/volume-condition.ts";
import { pathProblem, requireCanonicalPath } from "./paths.ts";

/** What the Node service needs from its process: identity, configuration and host ports. */
export interface NodeDeps {
  /** The node ID NodeGetInfo reports and ControllerPublishVolume receives (the Kubernetes node name). */
  readonly nodeId: string;
  /** The node's persistent NVMe host NQN (see host/host-nqn.ts); NodeStage connects only as it. */
  readonly hostNqn: string;
  /** Topology segments of this node, e.g. { "topology.storage.distort.io/zone": "a" }; none when empty. */
  readonly topology?: Readonly<Record<string, string>>;
  /** Volumes the CO may publish to this node; 0 or absent lets the CO decide. */
  readonly maxVolumesPerNode?: number;
  readonly initiator: NvmeInitiator;
  readonly mounter: Mounter;
  /** Existence and creation of staging/target paths and device nodes; rooted at "/" in production. */
  readonly fs: HostFs;
  readonly state: NodeStateStore;
  readonly clock: Clock;
  readonly logger: Logger;
  /** Filesystem for a mount capability with an empty fs_type. Default ext4. */
  readonly defaultFsType?: FsType;
  /** How long NodeStage waits for the namespace's device node, and NodeExpand for the new size. Default 30 s. */
  readonly deviceWaitMs?: number;
  /** Poll interval of those waits. Default 200 ms. */
  readonly pollMs?: number;
  /**
   * kubelet's root directory (/var/lib/kubelet): NodePublish and NodeUnpublish refuse a target_path
   * outside it, so no call can make the plugin mount over or remove a host path. Absent: no such
   * bound (csi-sanity and the lab put targets in their own directories).
   */
  readonly kubeletDir?: string;
}

/** True when canonical `path` lies strictly below directory `dir`. */
function isBelow(path: string, dir: string): boolean {
  const root = dir.endsWith("/") ? dir : `${dir}/`;
  return path.startsWith(root) && path.length > root.length;
}

// Stacked mounts on one path are unusual; this bounds the unmount loop if one keeps reappearing.
const MAX_STACKED_MOUNTS = 8;

/**
 * volume_path of NodeGetVolumeStats / NodeExpandVolume: empty is INVALID_ARGUMENT; a path that is
 * not canonical cannot be where this plugin put a volume, so it is NOT_FOUND (as for any unknown path).
 */
function volumePathOrNotFound(path: string): string {
  if (path === "") throw invalidArgument("volume_path is required");
  if (pathProblem(path) !== undefined) throw notFound(`no volume at ${JSON.stringify(path)}`);
  return path;
}

function describeAccess(a: VolumeAccess): string {
  return a.kind === "block"
    ? "raw block"
    : `${a.fsType} mount${a.mountFlags.length ? ` (${a.mountFlags.join(",")})` : ""}`;
}

/**
 * The Node service. Every RPC validates its whole request before any side effect (bad input is
 * INVALID_ARGUMENT and touches nothing), is idempotent, and holds the volume for its duration:
 * a second RPC for a volume already being worked on gets ABORTED. NodeGetVolumeStats and
 * NodeGetVolumeHealth only read and take no hold. Error codes follow the CSI spec's tables:
 * a device holding a different filesystem is FAILED_PRECONDITION (the volume cannot be used as
 * asked; nothing was staged), a staging or target path already used incompatibly is
 * ALREADY_EXISTS, a path that is not this volume's is NOT_FOUND.
 *
 * State: each staged volume has a record (NodeStateStore), written before the first connect so
 * a crash never loses track of a connection; a first stage that fails is rolled back (disconnect,
 * record removed). A device is formatted only when it reads back blank. Read-only raw block
 * publishes bind a read-only loop view of the device, because a read-only bind mount of a device
 * node does not stop writes through it. Reader-only modes (SINGLE_/MULTI_NODE_READER_ONLY) are
 * where read-only is enforced, since the target's ACL admits a host for writes too: staging sets
 * the device read-only in the kernel and mounts `ro`, refuses to format a blank device, and every
 * publication is read-only; unstaging clears the device's read-only flag again.
 */
export function createNodeService(deps: NodeDeps): Partial<ServiceImpl<typeof Node>> {
  return createNode(deps).service;
}

/** The Node service and the node-side work outside any RPC that shares its state and holds. */
export interface NodePlugin {
  readonly service: Partial<ServiceImpl<typeof Node>>;
  /** NodeUnstageVolume of `volumeId` at `stagingPath`, for the staging sweep; rejects "busy" while a call holds it. */
  unstage(volumeId: string, stagingPath: string): Promise<void>;
}

/** createNodeService with the plugin's own hold on the staging sweep's entry point. */
export function createNode(deps: NodeDeps): NodePlugin {
  const { initiator, mounter, fs, state, clock } = deps;
  const defaultFs: FsType = deps.defaultFsType ?? "ext4";
  const deviceWaitMs = deps.deviceWaitMs ?? 30_000;
  const pollMs = deps.pollMs ?? 200;
  const inFlight = new InFlight();

  /** Polls `probe` until it yields a value or the wait runs out; honours the call's cancellation. */
  async function waitFor<T>(
    what: string,
    signal: AbortSignal,
    probe: () => Promise<T | undefined>,
  ): Promise<T> {
    const deadline = clock.now() + deviceWaitMs;
    for (;;) {
      const got = await probe();
      if (got !== undefined) return got;
      if (clock.now() >= deadline) {
        throw new StorageError("unavailable", `${what} within ${deviceWaitMs} ms`);
      }
      await clock.sleep(pollMs, signal);
    }
  }

  /** A canonical target_path, below kubeletDir when one is configured (INVALID_ARGUMENT otherwise). */
  function requireKubeletTarget(raw: string): string {
    const target = requireCanonicalPath("target_path", raw);
    if (deps.kubeletDir !== undefined && !isBelow(target, deps.kubeletDir)) {
      throw invalidArgument(`target_path ${target} is outside kubelet's directory ${deps.kubeletDir}`);
    }
    return target;
  }

  async function unmountAll(path: string): Promise<void> {
    for (let i = 0; i < MAX_STACKED_MOUNTS; i++) {
      if ((await mounter.mountsAt(path)).length === 0) return;
      await mounter.unmount(path);
    }
    if ((await mounter.mountsAt(path)).length > 0) {
      throw new StorageError("internal", `${path} is still mounted after ${MAX_STACKED_MOUNTS} unmounts`);
    }
  }

  async function deviceNumberOrUndefined(path: string): Promise<string | undefined> {
    try {
      return await mounter.deviceNumber(path);
    } catch {
      return undefined;
    }
  }

  /** The visible mount at the staging path when it is this volume's filesystem, else undefined. */
  async function stagingMount(rec: StagedVolume, device: string): Promise<MountEntry | undefined> {
    const top = (await mounter.mountsAt(rec.stagingPath)).at(-1);
    if (top === undefined) return undefined;
    return top.majorMinor === (await mounter.deviceNumber(device)) && top.root === "/" ? top : undefined;
  }

  /** Makes the staging path show `device`'s filesystem, formatting only a readable blank device. */
  async function ensureStagingMount(
    rec: StagedVolume,
    device: string,
    access: VolumeAccess & { kind: "mount" },
    readonly: boolean,
    mkfsArgs: readonly string[],
  ) {
    const staging = rec.stagingPath;
    const top = (await mounter.mountsAt(staging)).at(-1);
    if (top !== undefined) {
      if ((await stagingMount(rec, device)) !== undefined && top.fsType === access.fsType) return;
      throw alreadyExists(
        `staging_target_path ${staging} already holds another mount (${top.source}, ${top.fsType})`,
      );
    }
    const content = await mounter.probe(device);
    if (content.kind === "blank" && readonly) {
      throw failedPrecondition(
        `volume ${rec.volumeId} is blank and staged ${rec.mode}: a reader-only volume is never formatted (that would write it); fill it first (a writer stage, a snapshot or a clone)`,
        { device },
      );
    }
    if (content.kind === "blank") {
      deps.logger.info("formatting blank volume", { volume: rec.volumeId, device, fsType: access.fsType });
      await mounter.mkfs(device, access.fsType, mkfsArgs);
      const made = await mounter.probe(device);
      if (made.kind !== "filesystem" || made.fsType !== access.fsType) {
        throw new StorageError("internal", `${device} does not show ${access.fsType} after mkfs`);
      }
    } else if (content.kind !== "filesystem" || content.fsType !== access.fsType) {
      const found = content.kind === "filesystem" ? `a ${content.fsType} filesystem` : content.description;
      throw failedPrecondition(
        `volume ${rec.volumeId} holds ${found}; it is neither blank nor ${access.fsType}, so it is neither formatted nor mounted`,
        { device },
      );
    }
    const flags =
      readonly && !access.mountFlags.includes("ro") ? [...access.mountFlags, "ro"] : access.mountFlags;
    await mounter.mount(device, staging, access.fsType, flags);
  }

  /** True when `top` (the visible mount at `target`) is this publication of the volume. */
  async function isOurPublication(
    rec: StagedVolume,
    device: string,
    target: string,
    top: MountEntry,
    pub: Publication | undefined,
  ): Promise<boolean> {
    if (rec.access.kind === "mount")
      return top.majorMinor === (await mounter.deviceNumber(device)) && top.root === "/";
    const at = await deviceNumberOrUndefined(target);
    const candidates = [device, ...(pub?.view ? [pub.view] : [])];
    for (const c of candidates)
      if (at !== undefined && at === (await deviceNumberOrUndefined(c))) return true;
    return false;
  }

  async function recordOf(volumeId: string): Promise<StagedVolume> {
    const rec = await state.get(volumeId);
    if (rec === undefined)
      throw notFound(`volume ${volumeId} is not staged on this node`, { volume: volumeId });
    return rec;
  }

  /**
   * What is wrong with a staged volume as this node sees it: its controllers' paths, its device
   * node, its staging mount and, when given, one publish path (the staging path counts as none).
   */
  async function healthIssues(rec: StagedVolume, publishPath: string | undefined): Promise<HealthIssue[]> {
    const subsystem = (await initiator.list()).find((s) => s.nqn === rec.nqn);
    const deviceExists = rec.device !== undefined && (await fs.exists(rec.device));
    const deviceNumber = rec.device === undefined ? undefined : await deviceNumberOrUndefined(rec.device);
    const observe = async (path: string): Promise<MountObservation> => {
      const top = (await mounter.mountsAt(path)).at(-1);
      if (top === undefined) return { path, mounted: false, ours: false };
      let ours: boolean;
      if (rec.access.kind === "mount") ours = deviceNumber !== undefined && top.majorMinor === deviceNumber;
      else {
        const pub = rec.publications.find((p) => p.targetPath === path);
        ours = rec.device !== undefined && (await isOurPublication(rec, rec.device, path, top, pub));
      }
      if (!ours || rec.access.kind === "block") return { path, mounted: true, ours };
      try {
        await mounter.statfs(path);
        return { path, mounted: true, ours };
      } catch (err) {
        return { path, mounted: true, ours, statfsError: (err as Error).message };
      }
    };
    return assessHealth({
      subsystem,
      deviceExists,
      staging: rec.access.kind === "mount" ? await observe(rec.stagingPath) : undefined,
      published:
        publishPath === undefined || publishPath === rec.stagingPath ? undefined : await observe(publishPath),
    });
  }

  /** NOT_FOUND unless `path` is the volume's staging path or one of its publications. */
  function requireVolumePath(rec: StagedVolume, path: string): void {
    if (path !== rec.stagingPath && !rec.publications.some((p) => p.targetPath === path)) {
      throw notFound(`${path} is not a staging or publish path of volume ${rec.volumeId}`, {
        volume: rec.volumeId,
      });
    }
  }

  /**
   * Connects the volume's subsystem through its primary portal and every further one (native
   * multipath: one device, several paths). A portal that failed is tried once more after the
   * others (a connect can time out on a loaded host, and nothing retries a path that never
   * connected). Succeeds when at least one path connected; a portal that failed twice is logged
   * and left to the next stage, since the others carry the I/O.
   */
  async function connectPaths(
    target: ReturnType<typeof parseStageContexts>,
    dhchap: ConnectSecrets | undefined,
    psk: string | undefined,
  ): Promise<void> {
    let pending = [target.connect, ...target.morePortals.map((p) => ({ ...target.connect, ...p }))];
    let first: unknown;
    let ok = 0;
    for (let attempt = 1; attempt <= 2 && pending.length > 0; attempt++) {
      const failed: typeof pending = [];
      for (const c of pending) {
        try {
          await initiator.connect({
            ...c,
            hostNqn: deps.hostNqn,
            ...(dhchap ? { dhchap } : {}),
            ...(psk ? { tls: { psk } } : {}),
          });
          ok++;
        } catch (err) {
          first ??= err;
          failed.push(c);
          deps.logger.warn("a portal of the volume did not connect", {
            nqn: c.nqn,
            address: c.address,
            port: c.port,
            attempt,
            error: (err as Error).message,
          });
        }
      }
      pending = failed;
    }
    if (ok === 0) throw first;
  }

  /**
   * Undoes a first stage that failed: disconnect (unless another volume shares the NQN), forget.
   * Anything mounted at the staging path (a mount that timed out yet happened) keeps it all.
   */
  async function rollBackStage(rec: StagedVolume, log: Logger): Promise<void> {
    try {
      if ((await mounter.mountsAt(rec.stagingPath)).length > 0) return;
      // A reader stage may have set the device read-only; as NodeUnstage does, clear it on the
      // device the NQN resolves to now: it outlives this volume when the connection is shared.
      if (isReaderMode(rec.mode)) {
        const now = await initiator.findNamespaceDevice(rec.nqn, rec.namespaceUUID);
        if (now !== undefined && (await fs.exists(now))) await mounter.setReadWrite(now);
      }
      const sharing = (await state.list()).some((r) => r.nqn === rec.nqn && r.volumeId !== rec.volumeId);
      if (!sharing) await initiator.disconnect(rec.nqn);
      await state.delete(rec.volumeId);
    } catch (err) {
      log.warn("could not undo a failed stage; NodeUnstage will", { error: (err as Error).message });
    }
  }

  /** NodeUnstageVolume's work, holding the volume; the staging sweep calls it too. */
  function unstage(volumeId: string, staging: string): Promise<void> {
    return inFlight.run(volumeId, "NodeUnstageVolume", async () => {
      const rec = await state.get(volumeId);
      if (rec === undefined) {
        // Nothing recorded: at most a mount the CO still sees; without a record the NQN is unknown.
        await unmountAll(staging);
        return;
      }
      const log = deps.logger.with({ volume: volumeId, nqn: rec.nqn });
      if (rec.stagingPath !== staging)
        throw failedPrecondition(`volume ${volumeId} is staged at ${rec.stagingPath}, not ${staging}`);
      const stillPublished: string[] = [];
      for (const p of rec.publications) {
        if ((await mounter.mountsAt(p.targetPath)).length > 0) stillPublished.push(p.targetPath);
      }
      if (stillPublished.length > 0) {
        throw failedPrecondition(`volume ${volumeId} is still published at ${stillPublished.join(", ")}`);
      }
      await unmountAll(staging);
      // Views left by an unpublish that stopped half-way.
      for (const p of rec.publications) if (p.view) await mounter.releaseReadOnlyView(p.view);
      if (isReaderMode(rec.mode)) {
        // The read-only flag outlives the volume when the device stays (a shared connection):
        // clear it on the device the NQN resolves to now, never a renumbered neighbour.
        const now = await initiator.findNamespaceDevice(rec.nqn, rec.namespaceUUID);
        if (now !== undefined && (await fs.exists(now))) await mounter.setReadWrite(now);
      }
      const sharing = (await state.list()).filter((r) => r.nqn === rec.nqn && r.volumeId !== volumeId);
      if (sharing.length === 0) await initiator.disconnect(rec.nqn);
      else
        log.warn("subsystem shared with other staged volumes; not disconnecting", {
          others: sharing.map((r) => r.volumeId),
        });
      await state.delete(volumeId);
      log.info("volume unstaged", { staging });
    });
  }

  const service: Partial<ServiceImpl<typeof Node>> = {
    async nodeStageVolume(req, ctx: HandlerContext) {
      const volumeId = requireVolumeId(req.volumeId);
      const staging = requireCanonicalPath("staging_target_path", req.stagingTargetPath);
      const cap = parseCapability(req.volumeCapability, defaultFs);
      const target = parseStageContexts(req.volumeContext, req.publishContext);
      // Checked again here (the controller checked the StorageClass): a context is only a map.
      const mkfsArgs =
        cap.access.kind === "mount" && target.mkfsOptions !== undefined
          ? parseMkfsOptions(target.mkfsOptions, cap.access.fsType)
          : [];
      if (target.hostNqn !== deps.hostNqn) {
        throw failedPrecondition(
          `volume ${volumeId} was published to host ${target.hostNqn}, but this node's host NQN is ${deps.hostNqn}`,
          { volume: volumeId },
        );
      }
      const nqn = target.connect.nqn;
      // The subsystem is named from the volume's UID (lib/volume-identity.ts): a volume context
      // naming any other subsystem would connect this volume's mount to someone else's data.
      const ref = parseVolumeId(volumeId);
      if (!ref) throw notFound(`volume ${volumeId} was not issued by this driver`, { volume: volumeId });
      const own = nqnFor(externalIdFor(ref.uid));
      if (nqn !== own) {
        throw invalidArgument(
          `volume_context names subsystem ${nqn}, but volume ${volumeId} is served as ${own}`,
          { volume: volumeId },
        );
      }
      const log = deps.logger.with({ volume: volumeId, nqn, attachment: target.attachmentId });
      return inFlight.run(volumeId, "NodeStageVolume", async () => {
        if (!(await fs.isDirectory(staging))) {
          throw failedPrecondition(
            `staging_target_path ${staging} is not an existing directory (the CO creates it)`,
          );
        }
        let rec = await state.get(volumeId);
        const fresh = rec === undefined;
        if (rec !== undefined) {
          if (rec.stagingPath !== staging)
            throw failedPrecondition(`volume ${volumeId} is already staged at ${rec.stagingPath}`);
          if (rec.nqn !== nqn)
            throw alreadyExists(`volume ${volumeId} is staged from subsystem ${rec.nqn}, not ${nqn}`);
          if (!sameAccess(rec.access, cap.access) || rec.mode !== cap.mode) {
            throw alreadyExists(
              `volume ${volumeId} is staged at ${staging} as ${describeAccess(rec.access)} (${rec.mode}); asked for ${describeAccess(cap.access)} (${cap.mode})`,
            );
          }
        } else {
          // Unknown volume, yet something is mounted where it is to be staged: not ours to cover.
          const top = (await mounter.mountsAt(staging)).at(-1);
          if (top !== undefined) {
            throw alreadyExists(
              `staging_target_path ${staging} already holds a mount (${top.source}, ${top.fsType})`,
            );
          }
          // Intent first: if the process dies below, NodeUnstage still knows which NQN to disconnect.
          rec = {
            volumeId,
            stagingPath: staging,
            nqn,
            namespaceUUID: target.namespaceUUID,
            access: cap.access,
            mode: cap.mode,
            publications: [],
          };
          await state.put(rec);
        }
        try {
          // DH-HMAC-CHAP keys come as NodeStage secrets: kubelet reads the PV's node-stage Secret
          // (node authorization lets it read only Secrets of volumes its Pods use) and hands
          // them over in the request; this plugin has no access to Secrets of its own.
          // A TLS volume's PSK for this host comes in the same Secret; with one, every path is TLS
          // (its listeners take nothing else).
          await connectPaths(
            target,
            hostKeyPairFrom(req.secrets, deps.hostNqn),
            hostPskFrom(req.secrets, deps.hostNqn),
          );
          const device = await waitFor(`the namespace of ${nqn} did not appear`, ctx.signal, async () => {
            const dev = await initiator.findNamespaceDevice(nqn, target.namespaceUUID);
            return dev !== undefined && (await fs.exists(dev)) ? dev : undefined;
          });
          if (rec.device !== device) {
            rec = { ...rec, device };
            await state.put(rec);
          }
          // Reader-only: the kernel refuses every write to the device itself, so neither a mount
          // nor a raw open on this node can write what other readers read.
          const readonly = isReaderMode(cap.mode);
          if (readonly) await mounter.setReadOnly(device);
          if (cap.access.kind === "mount")
            await ensureStagingMount(rec, device, cap.access, readonly, mkfsArgs);
          log.info("volume staged", { device, access: describeAccess(cap.access), staging });
        } catch (err) {
          // A first stage that fails leaves nothing behind, so a pod that never starts holds no
          // connection. Nothing was mounted (mounting is the last step), so the connection and
          // the record are all there is to undo; if undoing fails, the record stays for NodeUnstage.
          if (fresh) await rollBackStage(rec, log);
          throw err;
        }
        return {};
      });
    },

    async nodeUnstageVolume(req) {
      const volumeId = requireVolumeId(req.volumeId);
      const staging = requireCanonicalPath("staging_target_path", req.stagingTargetPath);
      await unstage(volumeId, staging);
      return {};
    },

    async nodePublishVolume(req) {
      const volumeId = requireVolumeId(req.volumeId);
      const target = requireKubeletTarget(req.targetPath);
      const cap = parseCapability(req.volumeCapability, defaultFs);
      // A required field that is missing is the caller's error, whatever else is wrong.
      if (req.stagingTargetPath === "") {
        throw invalidArgument("staging_target_path is required: the plugin offers STAGE_UNSTAGE_VOLUME");
      }
      const staging = requireCanonicalPath("staging_target_path", req.stagingTargetPath);
      if (target === staging) throw invalidArgument("target_path equals staging_target_path");
      return inFlight.run(volumeId, "NodePublishVolume", async () => {
        let rec = await state.get(volumeId);
        if (rec === undefined || rec.device === undefined)
          throw failedPrecondition(`volume ${volumeId} is not staged on this node`);
        // A reader-only volume is published read-only even when the CO did not ask for it.
        const readonly = req.readonly || isReaderMode(cap.mode) || isReaderMode(rec.mode);
        let device = rec.device;
        if (rec.stagingPath !== staging)
          throw failedPrecondition(`volume ${volumeId} is staged at ${rec.stagingPath}, not ${staging}`);
        const kindMatches =
          rec.access.kind === cap.access.kind &&
          (rec.access.kind === "block" ||
            (cap.access.kind === "mount" && rec.access.fsType === cap.access.fsType));
        if (!kindMatches) {
          throw failedPrecondition(
            `volume ${volumeId} is staged as ${describeAccess(rec.access)}, not ${describeAccess(cap.access)}`,
          );
        }
        if (rec.access.kind === "block") {
          // A device name is only the kernel's current numbering: after a reconnect the recorded
          // one may be another volume's namespace. The NQN (and namespace UUID) say which is ours.
          const now = await initiator.findNamespaceDevice(rec.nqn, rec.namespaceUUID);
          if (now === undefined || !(await fs.exists(now)))
            throw failedPrecondition(
              `volume ${volumeId}: no namespace of ${rec.nqn} is connected on this node; stage it again`,
            );
          if (now !== device) {
            deps.logger.info("volume's device renumbered", { volume: volumeId, was: device, now });
            rec = { ...rec, device: now };
            await state.put(rec);
            device = now;
          }
        }
        const pub = rec.publications.find((p) => p.targetPath === target);
        if (pub !== undefined && pub.readonly !== readonly) {
          throw alreadyExists(
            `volume ${volumeId} is published at ${target} ${pub.readonly ? "read-only" : "read-write"}`,
          );
        }
        if (!readonly && rec.mode === "SINGLE_NODE_SINGLE_WRITER") {
          const writer = rec.publications.find((p) => !p.readonly && p.targetPath !== target);
          if (writer)
            throw failedPrecondition(
              `SINGLE_NODE_SINGLE_WRITER volume ${volumeId} is already published read-write at ${writer.targetPath}`,
            );
        }
        const top = (await mounter.mountsAt(target)).at(-1);
        if (top !== undefined) {
          if (top.readonly === readonly && (await isOurPublication(rec, device, target, top, pub))) {
            if (pub === undefined)
              await state.put({
                ...rec,
                publications: [...rec.publications, { targetPath: target, readonly }],
              });
            return {};
          }
          throw alreadyExists(
            `target_path ${target} already holds another mount (${top.source}${top.readonly ? ", ro" : ""})`,
          );
        }
        const others = rec.publications.filter((p) => p.targetPath !== target);
        if (rec.access.kind === "mount") {
          if ((await stagingMount(rec, device)) === undefined) {
            throw failedPrecondition(`volume ${volumeId} is not mounted at ${staging}; stage it again`);
          }
          if (!(await fs.exists(target))) await mkdirUnder(fs, target);
          else if (!(await fs.isDirectory(target)))
            throw failedPrecondition(`target_path ${target} exists and is not a directory`);
          await state.put({ ...rec, publications: [...others, { targetPath: target, readonly }] });
          await mounter.bindMount(staging, target, { readonly });
          // fsGroup under VOLUME_MOUNT_GROUP: ext4 and XFS have no gid= mount option, so the tree
          // is given to the group as kubelet would have done (a read-only one cannot be, nor need be).
          if (cap.mountGroup !== undefined && !readonly)
            await mounter.applyMountGroup(target, cap.mountGroup);
        } else {
          if (!(await fs.exists(target))) await createEmptyFile(fs, target);
          else if (await fs.isDirectory(target))
            throw failedPrecondition(
              `target_path ${target} is a directory; a block volume is published on a file`,
            );
          const view = readonly ? (pub?.view ?? (await mounter.readOnlyView(device))) : undefined;
          await state.put({
            ...rec,
            publications: [...others, { targetPath: target, readonly, ...(view ? { view } : {}) }],
          });
          await mounter.bindMount(view ?? device, target, { readonly });
        }
        deps.logger.info("volume published", { volume: volumeId, target, readonly });
        return {};
      });
    },

    async nodeUnpublishVolume(req) {
      const volumeId = requireVolumeId(req.volumeId);
      const target = requireKubeletTarget(req.targetPath);
      return inFlight.run(volumeId, "NodeUnpublishVolume", async () => {
        const rec = await state.get(volumeId);
        const pub = rec?.publications.find((p) => p.targetPath === target);
        if (rec === undefined || pub === undefined) {
          // Never published there by this plugin (publish records before it mounts): whatever is
          // at the path is not ours to unmount or remove.
          if ((await mounter.mountsAt(target)).length > 0) {
            throw failedPrecondition(
              `${target} holds a mount, but volume ${volumeId} was not published there by this plugin; it is left alone`,
            );
          }
          return {};
        }
        // The last writer going: its data is written out to the device now, not at NodeUnstage.
        // A kubelet that dies before NodeUnstage forgets the staging mount, and the detach that
        // follows takes the device away with whatever the page cache still held. A writeback
        // error does not keep the publication: the data it lost is not saved by a retry (the
        // path may be revoked for good after a takeover), and the Pod's teardown must go on.
        const lastWriter =
          rec.access.kind === "mount" &&
          !pub.readonly &&
          !rec.publications.some((p) => p !== pub && !p.readonly);
        if (lastWriter && (await mounter.mountsAt(rec.stagingPath)).length > 0) {
          await mounter.syncFilesystem(rec.stagingPath).catch((err: unknown) =>
            deps.logger.warn(
              "the volume's filesystem could not be written out before unpublishing; unpublishing anyway",
              {
                volume: volumeId,
                target,
                err: errorMessage(err),
              },
            ),
          );
        }
        await unmountAll(target);
        if (await fs.isDirectory(target)) await fs.rmdir(target);
        else if (await fs.exists(target)) await fs.unlink(target);
        if (pub.view) await mounter.releaseReadOnlyView(pub.view);
        await state.put({ ...rec, publications: rec.publications.filter((p) => p !== pub) });
        deps.logger.info("volume unpublished", { volume: volumeId, target });
        return {};
      });
    },

    async nodeGetVolumeStats(req) {
      const volumeId = requireVolumeId(req.volumeId);
      const path = volumePathOrNotFound(req.volumePath);
      if (req.stagingTargetPath !== "") requireCanonicalPath("staging_target_path", req.stagingTargetPath);
      const rec = await recordOf(volumeId);
      requireVolumePath(rec, path);
      if (rec.device === undefined) throw notFound(`volume ${volumeId} has no device yet`);
      // kubelet's volume health reads the condition from here (see node/volume-condition.ts).
      const condition = async () => {
        const issues = await healthIssues(rec, path);
        return {
          abnormal: issues.some((i) => i.status === "INACCESSIBLE"),
          message: issues.map((i) => `${i.reason}: ${i.message}`).join("; "),
        };
      };
      if (rec.access.kind === "block") {
        const total = BigInt(await mounter.deviceSize(rec.device));
        return statsWithCondition([{ unit: VolumeUsage_Unit.BYTES, total }], await condition());
      }
      if ((await mounter.mountsAt(path)).length === 0) throw notFound(`nothing is mounted at ${path}`);
      let u: Awaited<ReturnType<Mounter["statfs"]>>;
      try {
        u = await mounter.statfs(path);
      } catch (err) {
        // A broken mount (EIO once the controller is lost) is a condition to report, not a failure.
        const c = await condition();
        if (!c.abnormal) throw err;
        return statsWithCondition([], c);
      }
      return statsWithCondition(
        [
          {
            unit: VolumeUsage_Unit.BYTES,
            total: BigInt(u.totalBytes),
            available: BigInt(u.availableBytes),
            used: BigInt(u.usedBytes),
          },
          {
            unit: VolumeUsage_Unit.INODES,
            total: BigInt(u.totalInodes),
            available: BigInt(u.freeInodes),
            used: BigInt(u.usedInodes),
          },
        ],
        await condition(),
      );
    },

    async nodeGetVolumeHealth(req) {
      const volumeId = requireVolumeId(req.volumeId);
      const publishPath =
        req.volumePublishPath === ""
          ? undefined
          : requireCanonicalPath("volume_publish_path", req.volumePublishPath);
      if (req.stagingTargetPath !== "") requireCanonicalPath("staging_target_path", req.stagingTargetPath);
      const rec = await recordOf(volumeId);
      if (publishPath !== undefined) requireVolumePath(rec, publishPath);
      const issues = await healthIssues(rec, publishPath);
      return {
        volumeHealth: {
          volumeId,
          healthStatuses: issues.map((i) => ({
            status:
              i.status === "DEGRADED" ? VolumeHealthErrorType.DEGRADED : VolumeHealthErrorType.INACCESSIBLE,
            reason: i.reason,
            message: i.message,
          })),
        },
      };
    },

    async nodeExpandVolume(req, ctx: HandlerContext) {
      const volumeId = requireVolumeId(req.volumeId);
      const path = volumePathOrNotFound(req.volumePath);
      if (req.stagingTargetPath !== "") requireCanonicalPath("staging_target_path", req.stagingTargetPath);
      const cap =
        req.volumeCapability === undefined ? undefined : parseCapability(req.volumeCapability, defaultFs);
      const required = req.capacityRange?.requiredBytes ?? 0n;
      const limit = req.capacityRange?.limitBytes ?? 0n;
      if (required < 0n || limit < 0n) throw invalidArgument("capacity_range must not be negative");
      if (limit > 0n && required > limit)
        throw invalidArgument("capacity_range required_bytes exceeds limit_bytes");
      return inFlight.run(volumeId, "NodeExpandVolume", async () => {
        const rec = await recordOf(volumeId);
        requireVolumePath(rec, path);
        if (cap !== undefined && cap.access.kind !== rec.access.kind) {
          throw new StorageError(
            "invalid",
            `volume ${volumeId} is staged as ${describeAccess(rec.access)}, not ${describeAccess(cap.access)}`,
          );
        }
        const device = rec.device;
        if (device === undefined) throw failedPrecondition(`volume ${volumeId} is not fully staged`);
        // The kernel revalidates namespaces asynchronously, and the target may announce the new
        // size only after this call began: ask again on every poll until the size is there.
        const size = await waitFor(`${device} did not grow to ${required} bytes`, ctx.signal, async () => {
          await initiator.rescan(rec.nqn);
          const s = await mounter.deviceSize(device);
          return BigInt(s) >= required ? s : undefined;
        });
        if (rec.access.kind === "mount") {
          if ((await stagingMount(rec, device)) === undefined) {
            throw failedPrecondition(
              `volume ${volumeId} is not mounted at ${rec.stagingPath}; stage it again`,
            );
          }
          await mounter.growFs(rec.access.fsType, device, rec.stagingPath);
        }
        deps.logger.info("volume expanded", { volume: volumeId, sizeBytes: size });
        return { capacityBytes: BigInt(size) };
      });
    },

    async nodeGetCapabilities() {
      const types = [
        RpcType.STAGE_UNSTAGE_VOLUME,
        RpcType.GET_VOLUME_STATS,
        RpcType.EXPAND_VOLUME,
        RpcType.SINGLE_NODE_MULTI_WRITER,
        RpcType.GET_VOLUME_HEALTH,
        RpcType.VOLUME_MOUNT_GROUP,
        VOLUME_CONDITION_RPC,
      ];
      return { capabilities: types.map((type) => ({ type: { case: "rpc" as const, value: { type } } })) };
    },

    async nodeGetInfo() {
      const segments = { ...(deps.topology ?? {}) };
      return {
        nodeId: deps.nodeId,
        maxVolumesPerNode: BigInt(deps.maxVolumesPerNode ?? 0),
        accessibleTopology: Object.keys(segments).length > 0 ? { segments } : undefined,
      };
    },
  };
  return { service, unstage };
}

/** mkdir of one level: the CO creates the parent, and a missing one is its error to fix. */
async function mkdirUnder(fs: HostFs, path: string): Promise<void> {
  try {
    await fs.mkdir(path);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "EEXIST") return;
    throw failedPrecondition(`cannot create ${path}: ${(err as Error).message}`);
  }
}

/** Creates an empty regular file for a block bind mount; an existing file is never truncated. */
async function createEmptyFile(fs: HostFs, path: string): Promise<void> {
  try {
    await fs.writeFile(path, "");
  } catch (err) {
    throw failedPrecondition(`cannot create ${path}: ${(err as Error).message}`);
  }
}
