// The SPDK target backend: drives nvmf_tgt over the persistent JSON-RPC client. Every export is
// reconciled component by component (transport, subsystem, namespace 1, listener, host ACL) from
// what nvmf_get_subsystems reports, so a partial export left by a crash or a target restart is
// repaired on the next pass. Mutations of one subsystem run under its lock.
import { createHash } from "node:crypto";
import { StorageError } from "../../../lib/errors.ts";
import type { KeyFiles } from "../../../lib/key-files.ts";
import type { Logger } from "../../../lib/log.ts";
import type { SpdkRpc } from "../../../lib/spdk/client.ts";
import type { SpdkMethods } from "../../../lib/spdk/methods.ts";
import type { SpdkReadCache } from "../../../lib/spdk/read-cache.ts";
import type { NvmfSubsystem } from "../../../lib/spdk/schemas.ts";
import { TargetFacts } from "../../../lib/spdk/target-facts.ts";
import {
  type DeviceRef,
  DRIVE_MISSING,
  type ExportSpec,
  type ExportState,
  type HostKeys,
  type HostPsks,
  hostKeyOf,
  type ListenerState,
  type QosLimits,
  type StandbySpec,
  type TargetBackend,
  TLS_UNSUPPORTED,
  type Transport,
  type Volume,
} from "../types.ts";
import { type TlsSupport, tlsSupport } from "./tls-support.ts";

/** Binds a PCIe function to a user-space driver (SPDK's setup script in production). */
export interface DriverBinder {
  bind(pciAddress: string): Promise<void>;
}

export interface SpdkTargetOptions {
  methods: SpdkMethods;
  rpc: SpdkRpc;
  binder: DriverBinder;
  /** Storage for DH-HMAC-CHAP secrets and TLS PSKs handed to SPDK's file keyring. */
  keyFiles: KeyFiles;
  /**
   * The target's SPDK carries commit 197ff0c9a5 (the TLS-PSK HKDF salt fix of v26.01) as a
   * backport, which spdk_get_version cannot show (DISTORT_SPDK_TLS_SALT_FIX). Default false.
   */
  tlsSaltFixBackported?: boolean;
  logger: Logger;
  /** Model number shown to initiators. */
  modelNumber?: string;
  /**
   * Node-wide facts verified on the current target; share one with the SPDK volume manager so a
   * target restart forgets them all at once. Default: a private one over `rpc`.
   */
  facts?: TargetFacts;
  /**
   * The read cache `methods` calls through, if any: prefetch() fills it with one listing of
   * every subsystem and bdev. Without it prefetch() does nothing.
   */
  reads?: SpdkReadCache;
}

const TRTYPE: Record<Transport, string> = { rdma: "RDMA", tcp: "TCP" };

/**
 * The agent's lock over one export's read-modify-write sequences. Distinct from the per-call
 * subsystem lock SpdkMethods takes inside (that one is not re-entrant), so nesting is safe.
 */
const KEYS_LOCK = "dhchap-keys";
/**
 * Fact: the last collection found no key unused. Forgotten whenever a pass may have left one
 * (a keyed host revoked, a key installed whose host was not admitted), and it lapses with a new
 * target or after the TTL; collection runs only while it is not known.
 */
const KEYS_COLLECTED = "dhchap-keys-collected";

/** details.reason of the StorageError when SPDK refused to listen on a portal's address. */
export const NOT_LISTENING = "NotListening";

function exportLockKey(nqn: string): string {
  return `export:${nqn}`;
}

/** SPDK's controller name for a drive: stable per serial, short enough for bdev names. */
export function controllerNameFor(serial: string): string {
  return `nvme_${createHash("sha256").update(serial).digest("hex").slice(0, 12)}`;
}

/**
 * Keyring name of one host's secret on one subsystem: derived from both NQNs and the secret, so a
 * rotated secret gets a new name and the old one can be dropped once nothing uses it.
 */
export function keyNameFor(nqn: string, host: string, secret: string): string {
  return `dhchap-${createHash("sha256").update(`${nqn}\0${host}\0${secret}`).digest("hex").slice(0, 24)}`;
}

/**
 * Keyring name of one host's TLS PSK on one subsystem (named like keyNameFor). SPDK keeps the
 * PSK in its TCP transport, not on the host entry (nvmf_get_subsystems lists the host bare), so
 * whether a host uses it is read from the key's refcnt: 1 for the keyring's own reference, one
 * more while the host entry holds it (v25.05.1-ha-qos-tls.jsonl seq 331, 353).
 */
export function pskNameFor(nqn: string, host: string, psk: string): string {
  return `tls-${createHash("sha256").update(`${nqn}\0${host}\0${psk}`).digest("hex").slice(0, 24)}`;
}

/** The fact key of the target's TLS verdict (spdk_get_version), once per target incarnation. */
const TLS_SUPPORT = "tls-support";

/** One keyring entry to install: its name and the secret its file holds. */
interface KeyEntry {
  readonly name: string;
  readonly secret: string;
}

export function adrfamOf(address: string): "IPv4" | "IPv6" {
  return address.includes(":") ? "IPv6" : "IPv4";
}

function sameAddress(
  a: { trtype: string; traddr: string; trsvcid?: string },
  t: Transport,
  addr: string,
  port: number,
) {
  return a.trtype.toUpperCase() === TRTYPE[t] && a.traddr === addr && a.trsvcid === String(port);
}

function isKind(err: unknown, ...kinds: string[]): boolean {
  return err instanceof StorageError && kinds.includes(err.kind);
}

export class SpdkTarget implements TargetBackend {
  readonly name = "spdk" as const;
  private readonly m: SpdkMethods;
  /** What the last successful ensureExport of each NQN found listening (listening()). */
  private readonly listened = new Map<string, ListenerState[]>();
  private readonly facts: TargetFacts;
  /** A TLS PSK was installed or found held by this process (so revokes may free one). */
  private pskSeen = false;

  constructor(private readonly opts: SpdkTargetOptions) {
    this.m = opts.methods;
    this.facts = opts.facts ?? new TargetFacts({ rpc: opts.rpc });
  }

  /**
   * Attaches the drive's PCIe controller to SPDK (binding the driver first) unless a controller
   * at that address is already attached, and checks that namespace 1 reports the expected serial.
   * Checked once per target incarnation (TargetFacts), not on every partition's pass.
   */
  async prepareDevice(device: DeviceRef): Promise<DeviceRef> {
    const bdevName = await this.facts.verified(`controller:${device.pciAddress}:${device.serial}`, () =>
      this.attachController(device),
    );
    return { ...device, bdevName };
  }

  /** The attach-and-check behind prepareDevice; resolves with namespace 1's bdev name. */
  private async attachController(device: DeviceRef): Promise<string> {
    const existing = await this.findController(device.pciAddress);
    let name = existing;
    if (!name) {
      await this.opts.binder.bind(device.pciAddress);
      name = controllerNameFor(device.serial);
      try {
        await this.m.bdevNvmeAttachController({ name, trtype: "PCIe", traddr: device.pciAddress });
      } catch (err) {
        if (isKind(err, "not-found")) {
          throw new StorageError(
            "not-found",
            `drive ${device.serial} cannot be attached at ${device.pciAddress}: ${(err as Error).message}`,
            {
              cause: err,
              details: { reason: DRIVE_MISSING, serial: device.serial, pciAddress: device.pciAddress },
            },
          );
        }
        if (!isKind(err, "already-exists")) throw err;
        name = (await this.findController(device.pciAddress)) ?? name;
      }
      // What was verified on the drive before it was (re)attached, its lvstore above all, no
      // longer holds until examine has run again.
      this.facts.forget();
    }
    const bdevName = `${name}n1`;
    const [bdev] = await this.m.bdevGetBdevs({ name: bdevName }).catch((err) => {
      if (isKind(err, "not-found")) {
        throw new StorageError(
          "precondition",
          `drive ${device.serial} has no namespace 1 under SPDK (${bdevName})`,
        );
      }
      throw err;
    });
    const serial = bdev?.driver_specific?.nvme?.[0]?.ctrlr_data?.serial_number?.trim();
    if (serial !== undefined && serial !== device.serial) {
      // Not the drive the partition was placed on (a swapped drive, a stale PCI address): undo our
      // own attach, so that nothing, this agent's later passes included, can use it by mistake. A
      // controller attached under another name is not ours to detach.
      const ours = name === controllerNameFor(device.serial);
      if (ours) {
        await this.m.bdevNvmeDetachController(name).catch((err) => {
          if (!isKind(err, "not-found")) throw err;
        });
        this.facts.forget();
      }
      throw new StorageError(
        "precondition",
        `controller at ${device.pciAddress} reports serial ${serial}, expected ${device.serial}: refusing to use it` +
          (ours ? " (detached again)" : ""),
        { details: { reason: "SerialMismatch", serial: device.serial, reported: serial } },
      );
    }
    return bdevName;
  }

  private async findController(pciAddress: string): Promise<string | undefined> {
    const ctrls = await this.m.bdevNvmeGetControllers();
    const want = pciAddress.toLowerCase();
    return ctrls.find((c) =>
      c.ctrlrs.some((p) => p.trid.trtype.toUpperCase() === "PCIE" && p.trid.traddr.toLowerCase() === want),
    )?.name;
  }

  private async subsystem(nqn: string): Promise<NvmfSubsystem | undefined> {
    try {
      const [s] = await this.m.nvmfGetSubsystems(nqn);
      return s;
    } catch (err) {
      if (isKind(err, "not-found")) return undefined;
      throw err;
    }
  }

  /**
   * bdev QoS on the volume's bdev: reads assigned_rate_limits, sets all four limits when any
   * differs (so the call is the whole desired state, never a partial update), and reads back.
   * "not-found" when the bdev is gone.
   */
  async applyQos(volume: Volume, limits: QosLimits): Promise<{ applied: QosLimits; changed: boolean }> {
    const read = async (): Promise<QosLimits> => {
      const [bdev] = await this.m.bdevGetBdevs({ name: volume.backendPath });
      const a = bdev?.assigned_rate_limits;
      if (!a)
        throw new StorageError("internal", `bdev ${volume.backendPath} reports no assigned_rate_limits`);
      return {
        rwIosPerSec: a.rw_ios_per_sec,
        rwMBytesPerSec: a.rw_mbytes_per_sec,
        rMBytesPerSec: a.r_mbytes_per_sec,
        wMBytesPerSec: a.w_mbytes_per_sec,
      };
    };
    const same = (a: QosLimits) =>
      a.rwIosPerSec === limits.rwIosPerSec &&
      a.rwMBytesPerSec === limits.rwMBytesPerSec &&
      a.rMBytesPerSec === limits.rMBytesPerSec &&
      a.wMBytesPerSec === limits.wMBytesPerSec;
    const before = await read();
    if (same(before)) return { applied: before, changed: false };
    await this.m.bdevSetQosLimit({
      name: volume.backendPath,
      rw_ios_per_sec: limits.rwIosPerSec,
      rw_mbytes_per_sec: limits.rwMBytesPerSec,
      r_mbytes_per_sec: limits.rMBytesPerSec,
      w_mbytes_per_sec: limits.wMBytesPerSec,
    });
    const after = await read();
    if (!same(after)) {
      // SPDK rounds IOPS up to its step; spec.qos only admits multiples, so this is drift.
      throw new StorageError(
        "internal",
        `bdev ${volume.backendPath} enforces ${JSON.stringify(after)} after being set to ${JSON.stringify(limits)}`,
      );
    }
    return { applied: after, changed: true };
  }

  async inspectExport(nqn: string): Promise<ExportState | undefined> {
    const s = await this.subsystem(nqn);
    if (!s) return undefined;
    return {
      nqn,
      namespace: s.namespaces?.find((n) => n.nsid === 1)?.bdev_name,
      listeners: s.listen_addresses.map((a) => ({
        transport: (a.trtype.toLowerCase() === "tcp" ? "tcp" : "rdma") as Transport,
        address: a.traddr,
        port: Number(a.trsvcid),
      })),
      hosts: s.hosts.map((h) => h.nqn),
    };
  }

  /** True when this call created the transport; checked once per target incarnation. */
  private async ensureTransport(t: Transport): Promise<boolean> {
    let created = false;
    await this.facts.verified(`transport:${TRTYPE[t]}`, async () => {
      created = await this.createTransport(t);
    });
    return created;
  }

  private async createTransport(t: Transport): Promise<boolean> {
    const have = await this.m.nvmfGetTransports();
    if (have.some((x) => x.trtype.toUpperCase() === TRTYPE[t])) return false;
    try {
      await this.m.nvmfCreateTransport({ trtype: TRTYPE[t] });
      return true;
    } catch (err) {
      if (isKind(err, "already-exists")) return false;
      throw err;
    }
  }

  ensureExport(spec: ExportSpec): Promise<string[]> {
    return this.facts.forgetOnError(() => this.reconcileExport(spec));
  }

  /**
   * Refuses a TLS export on a target whose SPDK cannot derive TLS PSKs (tls-support.ts), before
   * anything is created: StorageError precondition, details.reason TLS_UNSUPPORTED.
   */
  private async requireTls(spec: Pick<ExportSpec, "nqn" | "transport">): Promise<void> {
    if (spec.transport !== "tcp")
      throw new StorageError("invalid", `TLS export ${spec.nqn} needs transport tcp, not ${spec.transport}`);
    const verdict = await this.facts.verified<TlsSupport>(TLS_SUPPORT, async () =>
      tlsSupport(await this.m.spdkGetVersion(), this.opts.tlsSaltFixBackported === true),
    );
    if (!verdict.ok)
      throw new StorageError("precondition", verdict.why, { details: { reason: TLS_UNSUPPORTED } });
  }

  ensureStandby(spec: StandbySpec): Promise<string[]> {
    return this.facts.forgetOnError(() => this.reconcileExport({ ...spec, volume: undefined }));
  }

  /**
   * One pass making `spec` true: with a volume, namespace 1 before any listener is set
   * optimized; without one (a standby), every listener inaccessible before any namespace goes.
   */
  private async reconcileExport(
    spec: Omit<ExportSpec, "volume"> & { volume: ExportSpec["volume"] | undefined },
  ): Promise<string[]> {
    if (spec.tls) await this.requireTls(spec);
    const repaired: string[] = [];
    if (await this.ensureTransport(spec.transport)) repaired.push("transport");
    await this.opts.rpc.serialize(exportLockKey(spec.nqn), async () => {
      let s = await this.subsystem(spec.nqn);
      if (!s) {
        let created = false;
        try {
          await this.m.nvmfCreateSubsystem({
            nqn: spec.nqn,
            serial_number: spec.serialNumber,
            model_number: this.opts.modelNumber ?? "DISTORT",
            allow_any_host: false,
            max_namespaces: 1,
            // Only settable at creation (v25.05.1): per-listener ANA states for multipath, and
            // the controller IDs this node hands out.
            ana_reporting: true,
            ...(spec.cntlidRange
              ? { min_cntlid: spec.cntlidRange.min, max_cntlid: spec.cntlidRange.max }
              : {}),
          });
          created = true;
        } catch (err) {
          if (!isKind(err, "already-exists")) throw err;
        }
        repaired.push("subsystem");
        // Made by this call under the export lock: exactly what was asked, nothing in it yet (one
        // read fewer per export in a replay). One that already existed is read as it is.
        s = created
          ? {
              nqn: spec.nqn,
              subtype: "NVMe",
              listen_addresses: [],
              allow_any_host: false,
              hosts: [],
              namespaces: [],
            }
          : await this.subsystem(spec.nqn);
        if (!s) throw new StorageError("unavailable", `subsystem ${spec.nqn} vanished right after creation`);
      }
      if (s.allow_any_host) {
        await this.m.nvmfSubsystemAllowAnyHost(spec.nqn, false);
        repaired.push("host-policy");
      }
      // Exactly one namespace, nsid 1, backed by this volume's bdev; none on a standby, whose
      // namespaces go only once its listeners are inaccessible (below).
      const ns = s.namespaces ?? [];
      const volume = spec.volume;
      if (volume) {
        const uuid = spec.namespaceUuid?.toLowerCase();
        const right = ns.find(
          (n) =>
            n.nsid === 1 &&
            n.bdev_name === volume.backendPath &&
            (uuid === undefined || n.uuid?.toLowerCase() === uuid),
        );
        for (const n of ns) {
          if (n !== right) await this.removeNamespace(spec.nqn, n.nsid);
        }
        if (!right) {
          await this.m.nvmfSubsystemAddNs({
            nqn: spec.nqn,
            namespace: { bdev_name: volume.backendPath, nsid: 1, ...(uuid ? { uuid } : {}) },
          });
          repaired.push("namespace");
        }
      }
      // Exactly the asked-for listeners; a stale portal is withdrawn.
      const wanted = [...new Set([spec.address, ...(spec.moreAddresses ?? [])])];
      const have = new Set<string>();
      for (const a of s.listen_addresses) {
        const w = wanted.find((x) => sameAddress(a, spec.transport, x, spec.port));
        if (w !== undefined) {
          have.add(w);
          continue;
        }
        await this.m.nvmfSubsystemRemoveListener({
          nqn: spec.nqn,
          listen_address: {
            trtype: a.trtype,
            adrfam: a.adrfam as "IPv4",
            traddr: a.traddr,
            trsvcid: a.trsvcid,
          },
        });
        repaired.push("stale-listener");
      }
      for (const address of wanted) {
        if (have.has(address)) continue;
        const primary = address === spec.address;
        try {
          await this.addListener(spec, address);
          have.add(address);
          repaired.push(primary ? "listener" : `listener:${address}`);
        } catch (err) {
          // A further portal that cannot listen (its address gone from this host, taken) leaves
          // the export on the others; the caller sees it missing from listening().
          if (primary || !(err instanceof StorageError && err.details.reason === NOT_LISTENING)) throw err;
          // Debug: the partition reports it (condition message, one Event per change), and every
          // verify pass tries again.
          this.opts.logger.debug("a further portal of the export does not listen", {
            nqn: spec.nqn,
            address,
            port: spec.port,
            error: err.message,
          });
        }
      }
      const listening: ListenerState[] = wanted
        .filter((a) => have.has(a))
        .map((address) => ({ transport: spec.transport, address, port: spec.port }));
      // ANA matters once there is more than one path: every portal of this node serves the
      // volume, so each is kept optimized (an ANA state set by hand is put back). A subsystem
      // created without ana_reporting (before it was set at creation) reports none.
      if (!volume) {
        if (await this.keepAnaState(spec, listening, "inaccessible")) repaired.push("ana-state");
        for (const n of ns) {
          await this.removeNamespace(spec.nqn, n.nsid);
          repaired.push(`removed-namespace:${n.nsid}`);
        }
      } else if (listening.length > 1 || spec.keepOptimized) {
        if (await this.keepAnaState(spec, listening, "optimized")) repaired.push("ana-state");
      }
      this.listened.set(spec.nqn, listening);
    });
    // Debug only: the caller knows whether a repair was expected (a target restart replays every
    // export) and reports it, once per restart or per drifted export.
    if (repaired.length) this.opts.logger.debug("export repaired", { nqn: spec.nqn, repaired });
    return repaired;
  }

  /**
   * Adds the listener on `address`; StorageError with details.reason NOT_LISTENING when SPDK
   * refused to listen there (v25.05.1 answers an address this host does not have, or one in use,
   * with -32602 "Invalid parameters", the reply it gives a duplicate listener).
   */
  private async addListener(
    spec: Pick<ExportSpec, "nqn" | "transport" | "port" | "tls">,
    address: string,
  ): Promise<void> {
    const want = {
      trtype: TRTYPE[spec.transport],
      adrfam: adrfamOf(address),
      traddr: address,
      trsvcid: String(spec.port),
    };
    try {
      // A TLS listener takes TLS connections only. SPDK refuses one on a subsystem allowing any
      // host; ours never do (reconcileExport turned it off above), and the listing does not show
      // secure_channel, so the spec (immutable) is what keeps it.
      await this.m.nvmfSubsystemAddListener({
        nqn: spec.nqn,
        listen_address: want,
        ...(spec.tls ? { secure_channel: true } : {}),
      });
    } catch (err) {
      if (!isKind(err, "already-exists")) throw err;
      // Under the export lock a duplicate cannot have appeared since the listing, so only the
      // listener itself tells whether initiators can reach the export there.
      const now = await this.subsystem(spec.nqn);
      if (!now?.listen_addresses.some((a) => sameAddress(a, spec.transport, address, spec.port))) {
        throw new StorageError(
          "unavailable",
          `SPDK did not listen on ${want.trtype} ${address}:${spec.port} for ${spec.nqn}: the address is in use or not configured on this host`,
          { cause: err, details: { reason: NOT_LISTENING, address, port: spec.port } },
        );
      }
    }
  }

  private async removeNamespace(nqn: string, nsid: number): Promise<void> {
    await this.m.nvmfSubsystemRemoveNs(nqn, nsid).catch((err) => {
      if (!isKind(err, "not-found")) throw err;
    });
  }

  /**
   * Reads the listeners' ANA states into `listening` and sets `want` on any of them whose
   * group 1 (namespace 1's, SPDK's default anagrpid) is in another state. True when it set one.
   */
  private async keepAnaState(
    spec: Pick<ExportSpec, "nqn" | "transport">,
    listening: ListenerState[],
    want: "optimized" | "inaccessible",
  ): Promise<boolean> {
    let changed = false;
    for (const l of await this.m.nvmfSubsystemGetListeners(spec.nqn)) {
      const mine = listening.find((x) => sameAddress(l.address, spec.transport, x.address, x.port));
      const state = l.ana_states?.find((g) => g.ana_group === 1)?.ana_state;
      if (!mine || state === undefined) continue;
      mine.anaState = state;
      if (state === want) continue;
      await this.m.nvmfSubsystemListenerSetAnaState({
        nqn: spec.nqn,
        listen_address: {
          trtype: TRTYPE[spec.transport],
          adrfam: adrfamOf(mine.address),
          traddr: mine.address,
          trsvcid: String(mine.port),
        },
        ana_state: want,
      });
      mine.anaState = want;
      changed = true;
    }
    return changed;
  }

  async prefetch(): Promise<void> {
    await this.opts.reads?.load({ timeoutMs: 5000 });
  }

  listening(nqn: string): readonly ListenerState[] | undefined {
    return this.listened.get(nqn);
  }

  async setHosts(nqn: string, hostNQNs: readonly string[], keys?: HostKeys, psks?: HostPsks): Promise<void> {
    await this.opts.rpc.serialize(exportLockKey(nqn), async () => {
      const s = await this.subsystem(nqn);
      if (!s) throw new StorageError("not-found", `subsystem ${nqn} does not exist`);
      // Host NQN -> the keyring names (and secrets) it is admitted with; none for an unkeyed host.
      const want = new Map<string, { key?: KeyEntry; ctrlr?: KeyEntry; psk?: KeyEntry }>();
      for (const h of hostNQNs) {
        const v = keys?.get(h);
        const psk = psks?.get(h);
        const tls = psk === undefined ? {} : { psk: { name: pskNameFor(nqn, h, psk), secret: psk } };
        if (v === undefined) {
          want.set(h, tls);
          continue;
        }
        const k = hostKeyOf(v);
        want.set(h, {
          key: { name: keyNameFor(nqn, h, k.secret), secret: k.secret },
          ...(k.ctrlSecret === undefined
            ? {}
            : { ctrlr: { name: keyNameFor(nqn, `${h}\0ctrlr`, k.ctrlSecret), secret: k.ctrlSecret } }),
          ...tls,
        });
      }
      if (psks?.size) this.pskSeen = true;
      // The PSKs in use: a host holds its key (refcnt above the keyring's own 1).
      const held = psks?.size
        ? new Set((await this.m.keyringGetKeys()).filter((k) => (k.refcnt ?? 0) > 1).map((k) => k.name))
        : new Set<string>();
      // Revoke before granting, so a takeover never has two hosts allowed at once. A host that
      // stays and gets new DH-HMAC-CHAP keys (a rotation) keeps its entry and its connected
      // controllers: its new keys are loaded and swapped in with nvmf_subsystem_set_keys, which
      // only later authentications see; the old keys then have no user and are collected. A host
      // that loses its keys, or whose PSK changed (set_keys carries none), is revoked and re-admitted.
      const kept = new Set<string>();
      const rekeyed = new Set<string>();
      for (const h of s.hosts) {
        const w = want.get(h.nqn);
        if (
          w !== undefined &&
          w.key?.name === (h.dhchap_key || undefined) &&
          w.ctrlr?.name === (h.dhchap_ctrlr_key || undefined) &&
          (w.psk === undefined || held.has(w.psk.name))
        ) {
          kept.add(h.nqn);
          continue;
        }
        if (w?.key !== undefined && (w.psk === undefined || held.has(w.psk.name))) {
          rekeyed.add(h.nqn);
          continue;
        }
        await this.removeHost(nqn, h);
      }
      if (s.allow_any_host) await this.m.nvmfSubsystemAllowAnyHost(nqn, false);
      for (const [h, w] of want) {
        if (kept.has(h)) continue;
        // Key install and host admission form one step against collectKeys(), which would
        // otherwise see a freshly loaded key as unused.
        await this.opts.rpc.serialize(KEYS_LOCK, async () => {
          try {
            const loaded =
              w.key || w.psk ? new Set((await this.m.keyringGetKeys()).map((k) => k.name)) : new Set();
            for (const e of [w.key, w.ctrlr, w.psk]) {
              if (!e || loaded.has(e.name)) continue;
              const path = await this.opts.keyFiles.write(e.name, e.secret);
              await this.m.keyringFileAddKey({ name: e.name, path }).catch((err) => {
                if (!isKind(err, "already-exists")) throw err;
              });
            }
            const entry = {
              nqn,
              host: h,
              ...(w.key ? { dhchap_key: w.key.name } : {}),
              ...(w.ctrlr ? { dhchap_ctrlr_key: w.ctrlr.name } : {}),
            };
            const tls = w.psk ? { psk: w.psk.name } : {};
            if (rekeyed.has(h)) {
              await this.m.nvmfSubsystemSetKeys(entry);
              // The keys it authenticated with may be unused from now on.
              this.facts.forget(KEYS_COLLECTED);
            } else {
              await this.m.nvmfSubsystemAddHost({ ...entry, ...tls }).catch((err) => {
                if (!isKind(err, "already-exists")) throw err;
              });
            }
          } catch (err) {
            // The key may be installed while its host is not admitted: unused until a later pass.
            if (w.key || w.psk) this.facts.forget(KEYS_COLLECTED);
            throw err;
          }
        });
      }
    });
    await this.collectKeys();
  }

  /** Revokes one host; a key it authenticated with may be unused from now on. */
  private async removeHost(nqn: string, h: NvmfSubsystem["hosts"][number]): Promise<void> {
    try {
      await this.m.nvmfSubsystemRemoveHost(nqn, h.nqn).catch((err) => {
        if (!isKind(err, "not-found")) throw err;
      });
    } finally {
      // After the attempt, even a failed one (it may have happened): a collection recorded from
      // now on lists the subsystem without this host.
      // A host's PSK is not listed on its entry: once this process has seen PSKs, any revoked
      // host may have held one. (A new process collects once anyway: the fact starts unknown.)
      if (h.dhchap_key || h.dhchap_ctrlr_key || this.pskSeen) this.facts.forget(KEYS_COLLECTED);
    }
  }

  /**
   * Drops DH-CHAP keys (keyring entries and files) that no host of any subsystem uses any more.
   * Skipped while KEYS_COLLECTED is known: no pass could have left an unused key since the last
   * collection, and listing every subsystem is the one call whose cost grows with the export count.
   */
  private async collectKeys(): Promise<void> {
    if (this.facts.known(KEYS_COLLECTED)) return;
    // Under the lock, a collection that finished while this pass waited for it counts: it listed
    // the subsystems after this pass changed them.
    await this.opts.rpc.serialize(KEYS_LOCK, () =>
      this.facts.verified(KEYS_COLLECTED, () => this.collectKeysLocked()),
    );
  }

  private async collectKeysLocked(): Promise<void> {
    const used = new Set<string>();
    for (const sub of await this.m.nvmfGetSubsystems()) {
      for (const h of sub.hosts) {
        if (h.dhchap_key) used.add(h.dhchap_key);
        if (h.dhchap_ctrlr_key) used.add(h.dhchap_ctrlr_key);
      }
    }
    const keys = await this.m.keyringGetKeys();
    // A PSK is used while a host entry holds it (refcnt above the keyring's own reference).
    for (const k of keys) if (k.name.startsWith("tls-") && (k.refcnt ?? 0) > 1) used.add(k.name);
    for (const k of keys) {
      if ((k.name.startsWith("dhchap-") || k.name.startsWith("tls-")) && !used.has(k.name)) {
        await this.m.keyringFileRemoveKey(k.name).catch((err) => {
          if (!isKind(err, "not-found")) throw err;
        });
      }
    }
    for (const f of await this.opts.keyFiles.list()) {
      if ((f.startsWith("dhchap-") || f.startsWith("tls-")) && !used.has(f))
        await this.opts.keyFiles.remove(f);
    }
  }

  async removeExport(nqn: string): Promise<void> {
    this.listened.delete(nqn);
    await this.opts.rpc.serialize(exportLockKey(nqn), async () => {
      const s = await this.subsystem(nqn);
      if (!s) return;
      const gone = (err: unknown) => {
        if (!isKind(err, "not-found")) throw err;
      };
      for (const h of s.hosts) await this.removeHost(nqn, h);
      for (const a of s.listen_addresses) {
        await this.m
          .nvmfSubsystemRemoveListener({
            nqn,
            listen_address: {
              trtype: a.trtype,
              adrfam: a.adrfam as "IPv4",
              traddr: a.traddr,
              trsvcid: a.trsvcid,
            },
          })
          .catch(gone);
      }
      for (const n of s.namespaces ?? []) await this.m.nvmfSubsystemRemoveNs(nqn, n.nsid).catch(gone);
      await this.m.nvmfDeleteSubsystem(nqn).catch(gone);
    });
    await this.collectKeys();
  }
}
