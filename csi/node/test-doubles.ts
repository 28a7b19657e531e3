// Test support: in-memory stand-ins for the Node service's host ports (initiator, mounter, host
// filesystem, state store) that keep just enough state to behave like the host and record every
// call, so unit tests can assert both outcomes and the absence of side effects.

import { StorageError } from "../../lib/errors.ts";
import type { HostFs } from "../../lib/fs.ts";
import type { DeviceContent } from "../../lib/host/blkid.ts";
import type { FsType, FsUsage, Mounter } from "../host/mounter.ts";
import type { MountEntry } from "../host/mountinfo.ts";
import type { ConnectedSubsystem, ConnectParams, NvmeInitiator } from "../host/nvme-initiator.ts";
import type { NodeStateStore, StagedVolume } from "./state-store.ts";

/** A call to any double: port name, method, arguments. */
export type Call = readonly [port: string, method: string, ...args: unknown[]];

/** One shared call log for all doubles of a test. */
export class CallLog {
  readonly calls: Call[] = [];
  record(port: string, method: string, ...args: unknown[]): void {
    this.calls.push([port, method, ...args]);
  }
  methods(port: string): string[] {
    return this.calls.filter((c) => c[0] === port).map((c) => c[1]);
  }
}

/** Namespaces behind subsystems; connect() makes them visible as devices. */
export class FakeInitiator implements NvmeInitiator {
  /** nqn -> device its namespace shows up as once connected. */
  readonly devices = new Map<string, string>();
  readonly connected = new Map<string, ConnectedSubsystem>();
  /** Makes the next connect fail like a refused host. */
  refuse = false;
  /** Portal address -> how many more connects to it fail (a timed-out connect). */
  readonly failAt = new Map<string, number>();
  failDisconnect = false;
  /** Device appears only after this many lookups (udev lag). */
  lookupsBeforeDevice = 0;

  constructor(private readonly log: CallLog) {}

  async connect(p: ConnectParams): Promise<void> {
    this.log.record("initiator", "connect", p);
    if (this.refuse) throw new StorageError("unavailable", `host ${p.hostNqn} not allowed`);
    const left = this.failAt.get(p.address) ?? 0;
    if (left > 0) {
      this.failAt.set(p.address, left - 1);
      throw new StorageError("unavailable", `connect to ${p.address} timed out`);
    }
    this.connected.set(p.nqn, {
      nqn: p.nqn,
      hostNqn: p.hostNqn,
      name: `nvme-subsys${this.connected.size}`,
      paths: [
        { name: "nvme0", transport: p.transport, traddr: p.address, trsvcid: String(p.port), state: "live" },
      ],
    });
  }
  async disconnect(nqn: string): Promise<void> {
    this.log.record("initiator", "disconnect", nqn);
    if (this.failDisconnect) throw new StorageError("internal", "nvme disconnect failed");
    this.connected.delete(nqn);
  }
  async list(): Promise<ConnectedSubsystem[]> {
    this.log.record("initiator", "list");
    return [...this.connected.values()];
  }
  async findNamespaceDevice(nqn: string, namespaceId?: string): Promise<string | undefined> {
    this.log.record("initiator", "findNamespaceDevice", nqn, namespaceId);
    if (!this.connected.has(nqn)) return undefined;
    if (this.lookupsBeforeDevice > 0) {
      this.lookupsBeforeDevice--;
      return undefined;
    }
    return this.devices.get(nqn);
  }
  async rescan(nqn: string): Promise<void> {
    this.log.record("initiator", "rescan", nqn);
    if (!this.connected.has(nqn)) throw new StorageError("not-found", `no controller for ${nqn}`);
  }
}

/** A mount table and block devices in memory. Device numbers are "7:<index>" in creation order. */
export class FakeMounter implements Mounter {
  readonly table: MountEntry[] = [];
  readonly content = new Map<string, DeviceContent>();
  readonly sizes = new Map<string, number>();
  /** Devices set read-only by setReadOnly(); mkfs on one fails as the kernel would. */
  readonly readOnlyDevices = new Set<string>();
  readonly #numbers = new Map<string, string>();
  /** Paths (target files) bound to a device: stat follows the bind. */
  readonly #bound = new Map<string, string>();
  statfsError: string | undefined;
  /** Set: syncFilesystem() fails with it, as a writeback error would. */
  syncError: string | undefined;
  #nextId = 100;
  #views = 0;

  constructor(private readonly log: CallLog) {}

  /** Declares a device with its content and size. */
  addDevice(device: string, content: DeviceContent, sizeBytes: number): void {
    this.content.set(device, content);
    this.sizes.set(device, sizeBytes);
    this.#numbers.set(device, `7:${this.#numbers.size}`);
  }

  async mounts(): Promise<MountEntry[]> {
    this.log.record("mounter", "mounts");
    return [...this.table];
  }
  async mountsAt(path: string): Promise<MountEntry[]> {
    this.log.record("mounter", "mountsAt", path);
    return this.table.filter((e) => e.mountPoint === path);
  }
  async mount(device: string, target: string, fsType: FsType, options: readonly string[]): Promise<void> {
    this.log.record("mounter", "mount", device, target, fsType, options);
    this.#push({
      majorMinor: this.#number(device),
      root: "/",
      mountPoint: target,
      fsType,
      source: device,
      readonly: options.includes("ro"),
    });
  }
  async bindMount(source: string, target: string, opts: { readonly: boolean }): Promise<void> {
    this.log.record("mounter", "bindMount", source, target, opts);
    const under = this.table.filter((e) => e.mountPoint === source).at(-1);
    if (under) {
      this.#push({ ...under, mountPoint: target, readonly: opts.readonly });
    } else {
      this.#bound.set(target, source);
      this.#push({
        majorMinor: "0:6",
        root: source.replace("/dev", ""),
        mountPoint: target,
        fsType: "devtmpfs",
        source: "devtmpfs",
        readonly: opts.readonly,
      });
    }
  }
  async syncFilesystem(path: string): Promise<void> {
    this.log.record("mounter", "syncFilesystem", path);
    if (this.syncError !== undefined)
      throw new StorageError("internal", `sync -f ${path}: ${this.syncError}`);
    if (!this.table.some((e) => e.mountPoint === path))
      throw new StorageError("internal", `${path}: not mounted`);
  }
  async unmount(target: string): Promise<void> {
    this.log.record("mounter", "unmount", target);
    const at = this.table.map((e) => e.mountPoint).lastIndexOf(target);
    if (at < 0) throw new StorageError("internal", `umount: ${target}: not mounted`);
    this.table.splice(at, 1);
    if (!this.table.some((e) => e.mountPoint === target)) this.#bound.delete(target);
  }
  async probe(device: string): Promise<DeviceContent> {
    this.log.record("mounter", "probe", device);
    const c = this.content.get(device);
    if (c === undefined) throw new StorageError("unavailable", `cannot read ${device}`);
    return c;
  }
  async mkfs(device: string, fsType: FsType, extraArgs: readonly string[] = []): Promise<void> {
    if (extraArgs.length > 0) this.log.record("mounter", "mkfs", device, fsType, extraArgs);
    else this.log.record("mounter", "mkfs", device, fsType);
    if (this.readOnlyDevices.has(device)) throw new StorageError("internal", `mkfs: ${device} is read-only`);
    this.content.set(device, { kind: "filesystem", fsType });
  }
  async growFs(fsType: FsType, device: string, mountPoint: string): Promise<void> {
    this.log.record("mounter", "growFs", fsType, device, mountPoint);
  }
  async statfs(path: string): Promise<FsUsage> {
    this.log.record("mounter", "statfs", path);
    if (this.statfsError) throw new StorageError("internal", this.statfsError);
    return {
      totalBytes: 1000,
      availableBytes: 600,
      usedBytes: 400,
      totalInodes: 64,
      freeInodes: 60,
      usedInodes: 4,
    };
  }
  async deviceSize(device: string): Promise<number> {
    this.log.record("mounter", "deviceSize", device);
    const s = this.sizes.get(device);
    if (s === undefined) throw new StorageError("internal", `no device ${device}`);
    return s;
  }
  async deviceNumber(path: string): Promise<string> {
    this.log.record("mounter", "deviceNumber", path);
    return this.#number(this.#bound.get(path) ?? path);
  }
  async readOnlyView(device: string): Promise<string> {
    this.log.record("mounter", "readOnlyView", device);
    const view = `/dev/loop-ro${this.#views++}`;
    this.addDevice(view, this.content.get(device) ?? { kind: "blank" }, this.sizes.get(device) ?? 0);
    return view;
  }
  async setReadOnly(device: string): Promise<void> {
    this.log.record("mounter", "setReadOnly", device);
    this.readOnlyDevices.add(device);
  }
  async setReadWrite(device: string): Promise<void> {
    this.log.record("mounter", "setReadWrite", device);
    this.readOnlyDevices.delete(device);
  }

  async applyMountGroup(root: string, gid: number): Promise<void> {
    this.log.record("mounter", "applyMountGroup", root, gid);
  }
  async releaseReadOnlyView(view: string): Promise<void> {
    this.log.record("mounter", "releaseReadOnlyView", view);
  }

  #number(device: string): string {
    const n = this.#numbers.get(device);
    if (n === undefined) throw new StorageError("internal", `stat: cannot stat ${device}`);
    return n;
  }
  #push(e: Omit<MountEntry, "id" | "parentId" | "options" | "superOptions">): void {
    this.table.push({
      ...e,
      id: this.#nextId++,
      parentId: 1,
      options: [e.readonly ? "ro" : "rw"],
      superOptions: ["rw"],
    });
  }
}

/** A HostFs of directories and files in memory (no root needed). */
export class FakeFs implements HostFs {
  readonly root = "/";
  readonly dirs = new Set<string>(["/"]);
  readonly files = new Map<string, string>();

  constructor(private readonly log: CallLog) {}

  async readFile(p: string): Promise<string> {
    this.log.record("fs", "readFile", p);
    const f = this.files.get(p);
    if (f === undefined) throw Object.assign(new Error(`ENOENT: ${p}`), { code: "ENOENT" });
    return f;
  }
  async writeFile(p: string, d: string): Promise<void> {
    this.log.record("fs", "writeFile", p);
    this.#parent(p);
    this.files.set(p, d);
  }
  async readdir(p: string): Promise<string[]> {
    this.log.record("fs", "readdir", p);
    return [...this.dirs, ...this.files.keys()]
      .filter((x) => x !== p && x.startsWith(`${p}/`) && !x.slice(p.length + 1).includes("/"))
      .map((x) => x.slice(p.length + 1));
  }
  async readlink(p: string): Promise<string> {
    throw new Error(`not a link: ${p}`);
  }
  async symlink(): Promise<void> {
    throw new Error("symlink unsupported");
  }
  async mkdir(p: string): Promise<void> {
    this.log.record("fs", "mkdir", p);
    this.#parent(p);
    if (this.dirs.has(p) || this.files.has(p))
      throw Object.assign(new Error(`EEXIST: ${p}`), { code: "EEXIST" });
    this.dirs.add(p);
  }
  async rmdir(p: string): Promise<void> {
    this.log.record("fs", "rmdir", p);
    this.dirs.delete(p);
  }
  async unlink(p: string): Promise<void> {
    this.log.record("fs", "unlink", p);
    this.files.delete(p);
  }
  async exists(p: string): Promise<boolean> {
    this.log.record("fs", "exists", p);
    return this.dirs.has(p) || this.files.has(p);
  }
  async isDirectory(p: string): Promise<boolean> {
    this.log.record("fs", "isDirectory", p);
    return this.dirs.has(p);
  }
  #parent(p: string): void {
    const parent = p.slice(0, p.lastIndexOf("/")) || "/";
    if (!this.dirs.has(parent)) throw Object.assign(new Error(`ENOENT: ${parent}`), { code: "ENOENT" });
  }
}

/** Records in a Map. */
export class MemoryStateStore implements NodeStateStore {
  readonly records = new Map<string, StagedVolume>();
  constructor(private readonly log: CallLog) {}
  async get(volumeId: string): Promise<StagedVolume | undefined> {
    this.log.record("state", "get", volumeId);
    return this.records.get(volumeId);
  }
  async put(record: StagedVolume): Promise<void> {
    this.log.record("state", "put", record.volumeId);
    this.records.set(record.volumeId, structuredClone(record));
  }
  async delete(volumeId: string): Promise<void> {
    this.log.record("state", "delete", volumeId);
    this.records.delete(volumeId);
  }
  async list(): Promise<StagedVolume[]> {
    this.log.record("state", "list");
    return [...this.records.values()];
  }
}
