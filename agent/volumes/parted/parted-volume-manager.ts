// The parted volume manager: volumes are GPT partitions on a kernel-owned drive, created and
// removed with parted, named by their externalId so they are found again after any restart.
import { basename } from "node:path";
import { type Clock, realClock } from "../../../lib/clock.ts";
import { KeyedMutex } from "../../../lib/concurrency/keyed-mutex.ts";
import { StorageError } from "../../../lib/errors.ts";
import { type Exec, type ExecResult, runChecked } from "../../../lib/exec.ts";
import type { HostFs } from "../../../lib/fs.ts";
import { type Logger, silentLogger } from "../../../lib/log.ts";
import type { DeviceRef, Volume, VolumeManager, VolumeSpec } from "../../backends/types.ts";
import { type PartedPartition, type PartedTable, parsePartedPrint } from "./parted-output.ts";
import { DEFAULT_ALIGN, MiB, type Placement, placeVolume, roundUp } from "./placement.ts";
import { parseWipefs } from "./signatures.ts";

export interface PartedVolumeManagerOptions {
  /** Runs parted, partx, wipefs, blkdiscard and udevadm. */
  exec: Exec;
  /** Host filesystem holding /dev and /sys/class/block; hostFs("/") in production. */
  fs: HostFs;
  clock?: Clock;
  log?: Logger;
  /** Alignment of partition starts and sizes: a positive multiple of 1 MiB. Default 4 MiB. */
  alignBytes?: number;
  /** How long ensureVolume waits for a new partition's device node. Default 10 s. */
  nodeTimeoutMs?: number;
  /** Limit for each command. Default 60 s. */
  commandTimeoutMs?: number;
}

/** "vol-<hash>": also the GPT partition name, which holds at most 36 UTF-16 code units. */
const EXTERNAL_ID = /^vol-[A-Za-z0-9]{1,32}$/;
/** A kernel block device node; partition nodes are derived from its name. */
const BLOCK_DEVICE = /^\/dev\/[A-Za-z0-9][A-Za-z0-9._-]*$/;
const NODE_POLL_MS = 100;
/** 100 MiB/s: the slowest zeroing the timeout of a new partition's BLKZEROOUT allows for. */
const ZEROOUT_WORST_BYTES_PER_MS = (100 * MiB) / 1000;

/**
 * VolumeManager over GPT partitions.
 *
 * - prepareLayout writes a GPT label only on a blank disk (no label and no signature wipefs knows);
 *   a disk with any other label or content is StorageError("precondition") and is left untouched.
 * - ensureVolume finds the partition named spec.externalId or creates it first-fit, start aligned to
 *   alignBytes (never below 1 MiB), size rounded up to alignBytes. Before creating it zeroes the
 *   whole range (BLKZEROOUT), so a new volume never shows an earlier tenant's data, headers or
 *   otherwise. It returns once the kernel has the partition with the right geometry and /dev has
 *   its node.
 * - deleteVolume asks the kernel to drop the partition first (refused while anything has it open:
 *   StorageError("busy"), nothing changed), then removes it from the GPT. Absent counts as deleted.
 *
 * Idempotent and crash-safe at every step: the GPT is the only record, looked up by name each
 * time. Calls for one disk run one at a time (per-disk mutex in this instance; one instance per
 * node); different disks run in parallel. Errors: "invalid" for a bad spec, "precondition" for a
 * disk that is not ours to change or an ambiguous name, "exhausted" when no free range fits,
 * "already-exists" when the named partition is smaller than asked, "busy" for a partition in use,
 * "unavailable" when the device node does not appear, "internal" for command failures.
 */
export class PartedVolumeManager implements VolumeManager {
  readonly name = "parted" as const;
  readonly #exec: Exec;
  readonly #fs: HostFs;
  readonly #clock: Clock;
  readonly #log: Logger;
  readonly #align: number;
  readonly #nodeTimeoutMs: number;
  readonly #commandTimeoutMs: number;
  readonly #locks = new KeyedMutex();

  constructor(opts: PartedVolumeManagerOptions) {
    const align = opts.alignBytes ?? DEFAULT_ALIGN;
    if (!Number.isSafeInteger(align) || align <= 0 || align % MiB !== 0) {
      throw new StorageError("invalid", `alignBytes must be a positive multiple of 1 MiB, got ${align}`);
    }
    this.#exec = opts.exec;
    this.#fs = opts.fs;
    this.#clock = opts.clock ?? realClock;
    this.#log = (opts.log ?? silentLogger).with({ volumeManager: "parted" });
    this.#align = align;
    this.#nodeTimeoutMs = opts.nodeTimeoutMs ?? 10_000;
    this.#commandTimeoutMs = opts.commandTimeoutMs ?? 60_000;
  }

  async prepareLayout(device: DeviceRef): Promise<void> {
    const dev = blockDevice(device);
    await this.#locks.run(dev, async () => {
      const table = await this.#print(dev);
      if (table.disk.table === "gpt") return;
      if (table.disk.table !== "unknown") {
        throw new StorageError(
          "precondition",
          `${dev} carries a ${table.disk.table} label or filesystem; only a blank drive gets a GPT label`,
          { details: { device: dev, table: table.disk.table } },
        );
      }
      const signatures = parseWipefs(await this.#run(["wipefs", "--no-act", "--json", dev]));
      if (signatures.length > 0) {
        const found = signatures.map((s) => `${s.type}@${s.offset}`).join(", ");
        throw new StorageError(
          "precondition",
          `${dev} is not blank (${found}); only a blank drive gets a GPT label`,
          {
            details: { device: dev, signatures: found },
          },
        );
      }
      await this.#run(["parted", "-s", dev, "mklabel", "gpt"]);
      if ((await this.#print(dev)).disk.table !== "gpt") {
        throw new StorageError("internal", `parted mklabel gpt on ${dev} did not leave a GPT label`);
      }
      this.#log.info("wrote a GPT label", { device: dev });
    });
  }

  async findVolume(spec: VolumeSpec): Promise<Volume | undefined> {
    const { dev, id } = checkSpec(spec);
    return this.#locks.run(dev, async () => {
      const table = await this.#print(dev);
      if (table.disk.table !== "gpt") return undefined;
      const part = findByName(table, id, dev);
      return part && volumeOf(id, dev, part);
    });
  }

  async ensureVolume(spec: VolumeSpec): Promise<Volume> {
    const { dev, id } = checkSpec(spec);
    const size = roundUp(spec.sizeBytes, this.#align);
    return this.#locks.run(dev, async () => {
      const table = await this.#print(dev);
      if (table.disk.table !== "gpt") {
        throw new StorageError("precondition", `${dev} has no GPT label; prepareLayout comes first`, {
          details: { device: dev, table: table.disk.table },
        });
      }
      let part = findByName(table, id, dev);
      if (part && part.sizeBytes < size) {
        throw new StorageError(
          "already-exists",
          `volume ${id} exists on ${dev} with ${part.sizeBytes} bytes, less than the ${size} asked for`,
          { details: { volume: id, device: dev, sizeBytes: part.sizeBytes, requested: size } },
        );
      }
      if (!part) part = await this.#create(dev, id, size, table);
      await this.#waitForNode(dev, part);
      return volumeOf(id, dev, part);
    });
  }

  async deleteVolume(spec: VolumeSpec): Promise<void> {
    const { dev, id } = checkSpec(spec);
    await this.#locks.run(dev, async () => {
      const table = await this.#print(dev);
      if (table.disk.table !== "gpt") return;
      const part = findByName(table, id, dev);
      if (!part) return;
      const node = partitionNode(dev, part.number);
      // Kernel first: it refuses while the partition is open (mounted, exported by nvmet, held by
      // a process), and then nothing has changed. Removing the GPT entry first would leave the
      // kernel using a range the next volume could be given.
      const drop = await this.#try(["partx", "-d", "--nr", String(part.number), dev]);
      if (drop.code !== 0 && (await this.#fs.exists(node))) {
        throw new StorageError("busy", `${node} (volume ${id}) is in use: still exported, mounted or open`, {
          details: { volume: id, device: dev, node, stderr: drop.stderr.trim() },
        });
      }
      const rm = await this.#try(["parted", "-s", dev, "rm", String(part.number)]);
      if (findByName(await this.#print(dev), id, dev)) {
        throw new StorageError(
          "internal",
          `parted rm ${part.number} on ${dev} exited ${rm.code}: ${rm.stderr.trim()}`,
        );
      }
      this.#log.info("deleted partition", { volume: id, device: dev, partition: part.number });
    });
  }

  // --- steps; each runs under the disk's lock ---

  async #create(dev: string, id: string, size: number, table: PartedTable): Promise<PartedPartition> {
    const place = placeVolume(table.free, size, this.#align);
    if (!place) {
      const largest = Math.max(0, ...table.free.map((f) => f.sizeBytes));
      throw new StorageError(
        "exhausted",
        `no aligned free range of ${size} bytes on ${dev} (largest free ${largest})`,
        {
          details: { device: dev, requested: size, largestFree: largest },
        },
      );
    }
    await this.#zeroRange(dev, place);
    const made = await this.#try([
      "parted",
      "-s",
      "-a",
      "none",
      dev,
      "unit",
      "B",
      "mkpart",
      id,
      `${place.start}B`,
      `${place.end}B`,
    ]);
    const part = findByName(await this.#print(dev), id, dev);
    if (!part) {
      throw new StorageError(
        "internal",
        `parted mkpart ${id} on ${dev} exited ${made.code}: ${made.stderr.trim()}`,
      );
    }
    if (part.start !== place.start || part.end !== place.end) {
      throw new StorageError(
        "internal",
        `parted placed ${id} at ${part.start}-${part.end} on ${dev} instead of ${place.start}-${place.end}`,
      );
    }
    // A non-zero exit with the partition in the table means parted could not tell the kernel;
    // waiting for the node runs partx, which can.
    if (made.code !== 0)
      this.#log.warn("parted could not update the kernel", { device: dev, stderr: made.stderr.trim() });
    this.#log.info("created partition", {
      volume: id,
      device: dev,
      partition: part.number,
      start: part.start,
      size,
    });
    return part;
  }

  /**
   * Zeroes the whole range no partition covers yet, so a new volume reads nothing of what an
   * earlier tenant left there. BLKZEROOUT (blkdiscard --zeroout), not a plain discard: the kernel
   * offloads it to the drive's Write Zeroes (deallocating only where the drive guarantees zeros
   * after deallocate) or writes zeros itself, so the result reads as zeros on every drive, while a
   * discard reads as zeros only where the drive says so (DLFEAT) and is only a hint to the kernel.
   * --force: blkdiscard opens the disk O_EXCL by default, which fails while any other partition
   * of it is mounted or exported; the range is free in the GPT this lock just read.
   */
  async #zeroRange(dev: string, place: Placement): Promise<void> {
    const length = place.end + 1 - place.start;
    // A drive without Write Zeroes has the kernel write every byte: allow for 100 MiB/s at worst.
    const timeoutMs = Math.max(this.#commandTimeoutMs, Math.ceil(length / ZEROOUT_WORST_BYTES_PER_MS));
    await this.#run(
      [
        "blkdiscard",
        "--force",
        "--zeroout",
        "--offset",
        String(place.start),
        "--length",
        String(length),
        dev,
      ],
      timeoutMs,
    );
  }

  /**
   * Waits until the kernel has partition `part` with the table's geometry and /dev has its node.
   * parted normally tells the kernel itself; when it could not (or udev is slow), partx updates
   * this one partition and udevadm settle waits for the event queue, once, before polling.
   */
  async #waitForNode(dev: string, part: PartedPartition): Promise<void> {
    const node = partitionNode(dev, part.number);
    const deadline = this.#clock.now() + this.#nodeTimeoutMs;
    let triggered = false;
    for (;;) {
      const state = await this.#kernelView(node, part);
      if (state === "ok") return;
      if (!triggered) {
        triggered = true;
        await this.#try(["partx", "-u", "--nr", String(part.number), dev]);
        await this.#try(["udevadm", "settle", "--timeout=10"]).catch(() => undefined);
        continue;
      }
      if (this.#clock.now() >= deadline) {
        const why =
          state === "stale"
            ? `the kernel still has an older partition ${part.number} on ${dev} (in use?)`
            : `${node} did not appear`;
        throw new StorageError("unavailable", `${why} within ${this.#nodeTimeoutMs} ms`, {
          details: { device: dev, node, partition: part.number },
        });
      }
      await this.#clock.sleep(NODE_POLL_MS);
    }
  }

  /** "ok" when sysfs shows the partition at the table's start and size and its node exists. */
  async #kernelView(node: string, part: PartedPartition): Promise<"ok" | "missing" | "stale"> {
    const sys = `/sys/class/block/${basename(node)}`;
    const read = async (f: string) => {
      try {
        return Number((await this.#fs.readFile(`${sys}/${f}`)).trim());
      } catch {
        return undefined;
      }
    };
    const [start, size] = [await read("start"), await read("size")];
    if (start === undefined || size === undefined) return "missing";
    // sysfs counts 512-byte sectors whatever the device's sector size.
    if (start * 512 !== part.start || size * 512 !== part.sizeBytes) return "stale";
    return (await this.#fs.exists(node)) ? "ok" : "missing";
  }

  /** `parted -m -s <dev> unit B print free`, parsed; an unlabelled disk is a table of type "unknown". */
  async #print(dev: string): Promise<PartedTable> {
    const r = await this.#try(["parted", "-m", "-s", dev, "unit", "B", "print", "free"]);
    if (r.code === 0) return parsePartedPrint(r.stdout);
    if (/unrecognised disk label/i.test(r.stderr) && r.stdout.startsWith("BYT;")) {
      const table = parsePartedPrint(r.stdout);
      if (table.disk.table === "unknown") return table;
    }
    const kind = /No such file or directory|Could not stat/i.test(r.stderr) ? "not-found" : "internal";
    throw new StorageError(
      kind,
      `parted print on ${dev} exited ${r.code}: ${(r.stderr || r.stdout).trim()}`,
      {
        details: { device: dev },
      },
    );
  }

  /** Runs a command and returns its result whatever the exit code. */
  #try(argv: string[]): Promise<ExecResult> {
    return this.#exec.run(argv, { timeoutMs: this.#commandTimeoutMs });
  }

  /** Runs a command that must succeed; returns stdout. */
  #run(argv: string[], timeoutMs = this.#commandTimeoutMs): Promise<string> {
    return runChecked(this.#exec, argv, { timeoutMs });
  }
}

/** The kernel's name for partition `n` of `dev`: a "p" goes between when the disk name ends in a digit. */
export function partitionNode(dev: string, n: number): string {
  return /\d$/.test(dev) ? `${dev}p${n}` : `${dev}${n}`;
}

function blockDevice(device: DeviceRef): string {
  const dev = device.blockDevice;
  if (dev === undefined || !BLOCK_DEVICE.test(dev)) {
    throw new StorageError(
      "invalid",
      `device ${device.name} has no kernel block device /dev/<name> (got ${JSON.stringify(dev)}); the kernel backend's prepareDevice sets it`,
      { details: { device: device.name } },
    );
  }
  return dev;
}

function checkSpec(spec: VolumeSpec): { dev: string; id: string } {
  if (typeof spec.externalId !== "string" || !EXTERNAL_ID.test(spec.externalId)) {
    throw new StorageError(
      "invalid",
      `externalId ${JSON.stringify(spec.externalId)} is not vol-<1-32 letters or digits>`,
    );
  }
  if (!Number.isSafeInteger(spec.sizeBytes) || spec.sizeBytes <= 0) {
    throw new StorageError(
      "invalid",
      `volume ${spec.externalId}: size ${spec.sizeBytes} is not a positive whole number of bytes`,
    );
  }
  return { dev: blockDevice(spec.device), id: spec.externalId };
}

function findByName(table: PartedTable, id: string, dev: string): PartedPartition | undefined {
  const hits = table.partitions.filter((p) => p.name === id);
  if (hits.length > 1) {
    throw new StorageError(
      "precondition",
      `${hits.length} partitions on ${dev} are named ${id} (${hits.map((p) => p.number).join(", ")}); refusing to guess`,
      { details: { device: dev, volume: id } },
    );
  }
  return hits[0];
}

function volumeOf(id: string, dev: string, part: PartedPartition): Volume {
  return { externalId: id, backendPath: partitionNode(dev, part.number), sizeBytes: part.sizeBytes };
}
