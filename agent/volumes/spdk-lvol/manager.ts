// The spdk-lvol volume manager: one lvstore per drive (named from its serial) on the drive's
// namespace-1 bdev, one lvol per partition named by its externalId. Lookups go by the alias
// "<lvstore>/<externalId>" before anything is created, so a retry after a crash finds the lvol an
// earlier pass made instead of creating a second one.
import { StorageError } from "../../../lib/errors.ts";
import type { Logger } from "../../../lib/log.ts";
import type { SpdkRpc } from "../../../lib/spdk/client.ts";
import type { SpdkMethods } from "../../../lib/spdk/methods.ts";
import { ALLOCATION_UNIT } from "../../../lib/units.ts";
import type { DeviceRef, Volume, VolumeManager, VolumeSpec } from "../../backends/types.ts";
import { lvstoreNameFor } from "../../partitions/identity.ts";

const MiB = 1024 * 1024;

export interface SpdkLvolOptions {
  methods: SpdkMethods;
  /** For calls without a typed wrapper (bdev_wait_for_examine). */
  rpc: SpdkRpc;
  logger: Logger;
  /** Thin lvols allocate on write; the default is thick, matching the manager's accounting. */
  thinProvision?: boolean;
}

function isKind(err: unknown, kind: string): boolean {
  return err instanceof StorageError && err.kind === kind;
}

export class SpdkLvolVolumeManager implements VolumeManager {
  readonly name = "spdk-lvol" as const;
  private readonly m: SpdkMethods;

  constructor(private readonly opts: SpdkLvolOptions) {
    this.m = opts.methods;
  }

  /** Creates the drive's lvstore unless it exists; refuses an lvstore of that name on another bdev. */
  async prepareLayout(device: DeviceRef): Promise<void> {
    const lvs = lvstoreNameFor(device.serial);
    if (!device.bdevName)
      throw new StorageError("precondition", `drive ${device.serial} is not attached to SPDK`);
    // After an attach, SPDK examines the bdev and loads any lvstore on it asynchronously; looking
    // before examine finished would make an existing lvstore look absent and invite a second one.
    await this.opts.rpc.call("bdev_wait_for_examine").catch((err) => {
      if (!isKind(err, "unimplemented")) throw err;
    });
    const existing = await this.lvstore(lvs);
    if (existing) {
      if (existing.base_bdev !== device.bdevName) {
        throw new StorageError(
          "precondition",
          `lvstore ${lvs} sits on ${existing.base_bdev}, not on ${device.bdevName}: refusing to touch it`,
        );
      }
      return;
    }
    const [base] = await this.m.bdevGetBdevs({ name: device.bdevName });
    if (base?.claimed) {
      throw new StorageError(
        "precondition",
        `${device.bdevName} is claimed by another SPDK module (${base.claim_type ?? "unknown"}); not creating ${lvs} on it`,
      );
    }
    try {
      await this.m.bdevLvolCreateLvstore({
        bdev_name: device.bdevName,
        lvs_name: lvs,
        cluster_sz: ALLOCATION_UNIT,
        clear_method: "unmap",
      });
      this.opts.logger.info("lvstore created", { lvstore: lvs, bdev: device.bdevName });
    } catch (err) {
      if (!isKind(err, "already-exists")) throw err;
    }
  }

  private async lvstore(name: string) {
    try {
      const [s] = await this.m.bdevLvolGetLvstores({ lvs_name: name });
      return s;
    } catch (err) {
      if (isKind(err, "not-found")) return undefined;
      throw err;
    }
  }

  async findVolume(spec: VolumeSpec): Promise<Volume | undefined> {
    const alias = `${lvstoreNameFor(spec.device.serial)}/${spec.externalId}`;
    try {
      const [b] = await this.m.bdevGetBdevs({ name: alias });
      if (!b) return undefined;
      return { externalId: spec.externalId, backendPath: b.name, sizeBytes: b.num_blocks * b.block_size };
    } catch (err) {
      if (isKind(err, "not-found")) return undefined;
      throw err;
    }
  }

  async ensureVolume(spec: VolumeSpec): Promise<Volume> {
    const found = await this.findVolume(spec);
    if (found) return found.sizeBytes < spec.sizeBytes ? this.resizeVolume(spec) : found;
    try {
      await this.m.bdevLvolCreate({
        lvol_name: spec.externalId,
        size_in_mib: Math.ceil(spec.sizeBytes / MiB),
        lvs_name: lvstoreNameFor(spec.device.serial),
        thin_provision: this.opts.thinProvision ?? false,
        clear_method: "unmap",
      });
    } catch (err) {
      if (!isKind(err, "already-exists")) throw err;
    }
    const made = await this.findVolume(spec);
    if (!made)
      throw new StorageError("unavailable", `lvol ${spec.externalId} not visible right after creation`);
    this.opts.logger.info("lvol ready", {
      externalId: spec.externalId,
      bdev: made.backendPath,
      bytes: made.sizeBytes,
    });
    return made;
  }

  async resizeVolume(spec: VolumeSpec): Promise<Volume> {
    const found = await this.findVolume(spec);
    if (!found) throw new StorageError("not-found", `lvol ${spec.externalId} does not exist`);
    if (found.sizeBytes >= spec.sizeBytes) return found;
    await this.m.bdevLvolResize(found.backendPath, Math.ceil(spec.sizeBytes / MiB));
    return (await this.findVolume(spec)) ?? found;
  }

  async deleteVolume(spec: VolumeSpec): Promise<void> {
    const found = await this.findVolume(spec);
    if (!found) return;
    try {
      await this.m.bdevLvolDelete(found.backendPath);
    } catch (err) {
      if (!isKind(err, "not-found")) throw err;
    }
  }
}
