// SPDK's raid bdev module, raid1 only: mirrored base bdevs behind one "Raid Volume" bdev, with a
// superblock on every base (so a raid re-assembles by examine when its bases reappear), degraded
// operation when a member fails or is removed, and a rebuild onto an added member that copies the
// data in windows paced on the emulator's clock. Facts from module/bdev/raid (bdev_raid.c,
// bdev_raid_sb.c, raid1.c) of v25.05.1 and the `[1 raid1]` records.
import { randomUUID } from "node:crypto";
import type { Clock } from "../../../lib/clock.ts";
import { Mutex } from "../../../lib/concurrency/mutex.ts";
import type { Logger } from "../../../lib/log.ts";
import { Bdev, type BdevRegistry, IO_TYPES } from "./bdev.ts";
import type { BlockIo } from "./block-io.ts";
import { checkRange } from "./block-io.ts";
import { TICK_RATE } from "./core-mask.ts";
import type { JsonValue } from "./json-stream.ts";
import { Errno, ErrnoError } from "./rpc-error.ts";

export const ZERO_UUID = "00000000-0000-0000-0000-000000000000";
/** RAID_BDEV_MIN_DATA_OFFSET_SIZE: a superblock raid keeps the first 1 MiB of every base. */
const SB_RESERVED_BYTES = 1024 * 1024;
/** Marks our superblock in a base's first block (SPDK's is binary "SPDKRAID"; ours is JSON). */
const SB_MAGIC = "SPDKRAID-emu1:";
/** The claim owner shown for raid members (bdev_get_bdevs claim_type exclusive_write). */
const CLAIM_OWNER = "raid";

export type RaidState = "online" | "configuring" | "offline";

/** bdev_raid_set_options (raid_bdev_opts): the pacing of background processes. */
export interface RaidOptions {
  process_window_size_kb: number;
  process_max_bandwidth_mb_sec: number;
}

/** One slot of base_bdevs_list. */
interface Slot {
  /** Printed name: the name given at create, the bdev name after examine, null once failed. */
  name: string | null;
  uuid: string;
  bdev: Bdev | null;
  configured: boolean;
  dataOffset: number;
  dataSize: number;
}

/** What every base's superblock records (a subset of SPDK's raid_bdev_superblock). */
interface Superblock {
  uuid: string;
  name: string;
  seq: number;
  blockSize: number;
  numBlocks: number;
  dataOffset: number;
  /** Per slot the member's UUID and whether it was a configured member at this sequence number. */
  slots: { uuid: string; configured: boolean }[];
}

interface Rebuild {
  readonly slot: Slot;
  /** Blocks copied so far (SPDK's process window position). */
  blocks: number;
  cancel: () => void;
}

/** One raid1 bdev (registered in the bdev layer while online). */
export class Raid {
  readonly slots: Slot[];
  state: RaidState = "configuring";
  bdev: Bdev | null = null;
  rebuild: Rebuild | null = null;
  /** Superblock sequence number, bumped on every membership change. */
  seq = 0;
  blockSize = 0;
  numBlocks = 0;
  /** Serialises member writes against rebuild window copies, so no copy overwrites a newer write. */
  readonly lock = new Mutex();
  /** Slots an examined superblock says should come back before the raid goes online. */
  expected = 0;

  constructor(
    readonly name: string,
    readonly uuid: string,
    readonly superblock: boolean,
    numSlots: number,
  ) {
    this.slots = Array.from({ length: numSlots }, () => ({
      name: null,
      uuid: ZERO_UUID,
      bdev: null,
      configured: false,
      dataOffset: 0,
      dataSize: 0,
    }));
  }

  get discovered(): number {
    return this.slots.filter((s) => s.configured).length;
  }

  /** bdev_raid_get_bdevs / driver_specific.raid body (without the name), keys in SPDK's order. */
  info(): { [key: string]: JsonValue } {
    const out: { [key: string]: JsonValue } = {
      uuid: this.uuid,
      strip_size_kb: 0,
      state: this.state,
      raid_level: "raid1",
      superblock: this.superblock,
      num_base_bdevs: this.slots.length,
      num_base_bdevs_discovered: this.discovered,
      // raid1 tolerates all but one failure: operational counts configured members once online.
      num_base_bdevs_operational: this.state === "configuring" ? this.slots.length : this.discovered,
    };
    if (this.rebuild) {
      const blocks = this.rebuild.blocks;
      out.process = {
        type: "rebuild",
        target: this.rebuild.slot.name,
        progress: { blocks, percent: Math.floor((blocks * 100) / Math.max(1, this.numBlocks)) },
      };
    }
    out.base_bdevs_list = this.slots.map((s) => ({
      name: s.name,
      uuid: s.uuid,
      is_configured: s.configured,
      data_offset: s.dataOffset,
      data_size: s.dataSize,
    }));
    return out;
  }
}

function raidSize(bases: readonly Bdev[], superblock: boolean): { offset: number; size: number } {
  const blockSize = bases[0]?.blockSize ?? 512;
  const offset = superblock ? Math.ceil(SB_RESERVED_BYTES / blockSize) : 0;
  const min = Math.min(...bases.map((b) => b.numBlocks));
  return { offset, size: Math.max(0, min - offset) };
}

/** All raid bdevs of one app. */
export class Raids {
  readonly #byName = new Map<string, Raid>();
  options: RaidOptions = { process_window_size_kb: 1024, process_max_bandwidth_mb_sec: 0 };

  constructor(
    private readonly registry: BdevRegistry,
    private readonly clock: Clock,
    private readonly log: Logger,
  ) {
    registry.addRemovalHook((b) => this.#onBaseRemoved(b));
    registry.addExaminer((b) => this.#examine(b));
  }

  list(): Raid[] {
    return [...this.#byName.values()];
  }

  get(name: string): Raid | undefined {
    return this.#byName.get(name);
  }

  /** The raid holding `bdev` as a configured member, and its slot. */
  memberOf(bdev: Bdev): { raid: Raid; slot: Slot } | undefined {
    for (const raid of this.#byName.values()) {
      const slot = raid.slots.find((s) => s.bdev === bdev);
      if (slot) return { raid, slot };
    }
    return undefined;
  }

  /**
   * raid_bdev_create + adding each named base. Missing bases leave their slot waiting (state
   * configuring); a claimed base fails the whole create (EPERM) and leaves nothing behind.
   */
  async create(
    name: string,
    baseNames: readonly string[],
    superblock: boolean,
    uuid?: string,
  ): Promise<void> {
    if (baseNames.length < 2)
      throw new ErrnoError(Errno.EINVAL, "At least 2 base devices required for raid1");
    if (this.#byName.has(name) || this.registry.taken(name)) {
      throw new ErrnoError(Errno.EEXIST, `Duplicate raid bdev name found: ${name}`);
    }
    const raid = new Raid(name, uuid ?? randomUUID(), superblock, baseNames.length);
    const found = baseNames.map((n) => this.registry.get(n));
    const present = found.filter((b): b is Bdev => b !== undefined);
    const claimed = present.find((b) => b.claim !== null);
    if (claimed) throw new ErrnoError(Errno.EPERM, `bdev ${claimed.name} already claimed`);
    const { offset, size } = raidSize(present, superblock);
    raid.blockSize = present[0]?.blockSize ?? 512;
    raid.numBlocks = size;
    baseNames.forEach((n, i) => {
      const slot = raid.slots[i] as Slot;
      slot.name = n;
      const b = found[i];
      if (!b) return;
      this.registry.claim(b, "exclusive_write", CLAIM_OWNER);
      Object.assign(slot, { bdev: b, uuid: b.uuid, configured: true, dataOffset: offset, dataSize: size });
    });
    this.#byName.set(name, raid);
    if (raid.discovered === raid.slots.length) await this.#goOnline(raid);
  }

  async #goOnline(raid: Raid): Promise<void> {
    raid.state = "online";
    raid.seq++;
    await this.#writeSuperblocks(raid);
    const bdev = new Bdev({
      name: raid.name,
      uuid: raid.uuid,
      module: "raid",
      productName: "Raid Volume",
      blockSize: raid.blockSize,
      io: new Raid1Io(raid, (slot, bdev, err) => this.#failSlot(raid, slot, err, bdev)),
      ioTypes: { ...IO_TYPES.lvol, seek_hole: false, seek_data: false },
      memoryDomainsOf: () => memberDomains(raid),
      driverSpecific: () => ({ raid: raid.info() }),
    });
    raid.bdev = bdev;
    await this.registry.register(bdev);
  }

  /** bdev_raid_delete: unregisters the bdev and releases the members; superblocks stay. */
  async delete(name: string): Promise<void> {
    const raid = this.#byName.get(name);
    if (!raid) throw new ErrnoError(Errno.ENODEV, `raid bdev ${name} not found`);
    raid.rebuild?.cancel();
    raid.rebuild = null;
    this.#byName.delete(name);
    if (raid.bdev) await this.registry.unregister(raid.bdev);
    for (const s of raid.slots) if (s.bdev) this.registry.release(s.bdev, CLAIM_OWNER);
  }

  /** bdev_raid_remove_base_bdev: ENODEV for a bdev that is no configured member. */
  async removeBase(bdevName: string): Promise<void> {
    const b = this.registry.get(bdevName);
    const m = b ? this.memberOf(b) : undefined;
    if (!m) throw new ErrnoError(Errno.ENODEV, "not a raid member");
    await this.#dropSlot(m.raid, m.slot);
  }

  /**
   * Takes a member out: its slot reads name null, zero uuid, offset 0; the raid stays online with
   * the others, and the last member's removal deletes the raid (its superblock still says online).
   */
  async #dropSlot(raid: Raid, slot: Slot): Promise<void> {
    const bdev = slot.bdev;
    if (raid.rebuild?.slot === slot) {
      raid.rebuild.cancel();
      raid.rebuild = null;
    }
    const last = raid.discovered === 1 && raid.state === "online";
    if (last) {
      // The superblock on the last member still records it as configured, which is why a restart
      // brings the raid back from it.
      await this.delete(raid.name);
      return;
    }
    Object.assign(slot, { name: null, uuid: ZERO_UUID, bdev: null, configured: false, dataOffset: 0 });
    if (bdev) this.registry.release(bdev, CLAIM_OWNER);
    if (raid.state === "online") {
      raid.seq++;
      await this.#writeSuperblocks(raid);
    }
  }

  /**
   * raid_bdev_fail_base_bdev: once per member (base_info->is_failed); a slot that no longer holds
   * `bdev` (already failed, removed or hot-removed meanwhile) is left alone.
   */
  #failSlot(raid: Raid, slot: Slot, err: unknown, bdev: Bdev | null = slot.bdev): void {
    if (this.#byName.get(raid.name) !== raid || !slot.configured || !bdev || slot.bdev !== bdev) return;
    this.log.warn("raid1 failing base bdev", { raid: raid.name, base: slot.name, err: String(err) });
    void this.#dropSlot(raid, slot);
  }

  /**
   * bdev_raid_add_base_bdev: into the first empty slot of an online raid, then a rebuild onto it.
   * EPERM while a process runs; EINVAL with no empty slot.
   */
  async addBase(raidName: string, bdevName: string): Promise<void> {
    const raid = this.#byName.get(raidName);
    if (!raid) throw new ErrnoError(Errno.ENODEV, `raid bdev ${raidName} is not found in config`);
    if (raid.rebuild) throw new ErrnoError(Errno.EPERM, `raid bdev '${raidName}' is in process`);
    let slot = raid.slots.find((s) => !s.configured && s.bdev === null);
    if (!slot) throw new ErrnoError(Errno.EINVAL, "no empty slot found");
    const b = this.registry.get(bdevName);
    if (!b) throw new ErrnoError(Errno.ENODEV, `bdev ${bdevName} not found`);
    if (b.claim) throw new ErrnoError(Errno.EPERM, `bdev ${b.name} already claimed`);
    // raid_bdev_configure_base_bdev_check_sb_cb: a bdev carrying this raid's (stale) superblock
    // is re-added by examine (raid_bdev_examine_sb): into the slot its superblock names, under
    // its bdev name rather than the name given.
    let name = bdevName;
    if (raid.superblock && raid.state === "online") {
      const sb = await readSuperblock(b);
      if (sb?.uuid === raid.uuid) {
        const at = sb.slots.findIndex((x) => x.uuid === b.uuid);
        const own = raid.slots[at];
        if (own && !own.configured && own.bdev === null) slot = own;
        name = b.name;
        this.log.info("Re-adding bdev to raid bdev", { bdev: b.name, raid: raid.name });
      }
    }
    const offset = raid.superblock ? Math.ceil(SB_RESERVED_BYTES / raid.blockSize) : 0;
    if (b.blockSize !== raid.blockSize || b.numBlocks - offset < raid.numBlocks) {
      throw new ErrnoError(Errno.EINVAL, "base bdev too small or of another block size");
    }
    this.registry.claim(b, "exclusive_write", CLAIM_OWNER);
    Object.assign(slot, {
      name,
      uuid: b.uuid,
      bdev: b,
      dataOffset: offset,
      dataSize: raid.numBlocks,
    });
    if (raid.state !== "online") {
      slot.configured = true;
      if (raid.discovered === raid.slots.length) await this.#goOnline(raid);
      return;
    }
    slot.configured = true;
    raid.seq++;
    await this.#writeSuperblocks(raid);
    this.#startRebuild(raid, slot);
  }

  /**
   * Copies the mirror onto `slot` one process window at a time. With a bandwidth limit each window
   * waits its share of a second, so progress is visible on the clock (SPDK paces the same way).
   */
  #startRebuild(raid: Raid, slot: Slot): void {
    let cancelled = false;
    let cancelTimer = () => {};
    const rebuild: Rebuild = {
      slot,
      blocks: 0,
      cancel: () => {
        cancelled = true;
        cancelTimer();
      },
    };
    raid.rebuild = rebuild;
    const step = async () => {
      if (cancelled) return;
      const windowBlocks = Math.max(
        1,
        Math.floor((this.options.process_window_size_kb * 1024) / raid.blockSize),
      );
      const n = Math.min(windowBlocks, raid.numBlocks - rebuild.blocks);
      try {
        await raid.lock.run(async () => {
          const source = raid.slots.find((s) => s.configured && s !== slot && s.bdev);
          if (!source?.bdev || !slot.bdev) throw new ErrnoError(Errno.EIO, "no rebuild source");
          const data = await memberRead(
            source.bdev,
            (source.dataOffset + rebuild.blocks) * raid.blockSize,
            n * raid.blockSize,
          );
          if (cancelled) return;
          await memberWrite(slot.bdev, (slot.dataOffset + rebuild.blocks) * raid.blockSize, data);
        });
      } catch (err) {
        if (cancelled) return;
        raid.rebuild = null;
        this.#failSlot(raid, slot, err);
        return;
      }
      if (cancelled) return;
      rebuild.blocks += n;
      if (rebuild.blocks >= raid.numBlocks) {
        raid.rebuild = null;
        this.log.info("Finished rebuild on raid bdev", { raid: raid.name });
        return;
      }
      const mbs = this.options.process_max_bandwidth_mb_sec;
      const delay = mbs > 0 ? ((n * raid.blockSize) / (mbs * 1024 * 1024)) * 1000 : 0;
      cancelTimer = this.clock.setTimeout(() => void step(), delay);
    };
    cancelTimer = this.clock.setTimeout(() => void step(), 0);
  }

  /** Whether `slot` holds data readers may use: not a rebuild target past its copied window. */
  static readable(raid: Raid, slot: Slot, block: number, count: number): boolean {
    if (!slot.configured || !slot.bdev) return false;
    const r = raid.rebuild;
    return !(r && r.slot === slot && block + count > r.blocks);
  }

  async #onBaseRemoved(b: Bdev): Promise<void> {
    const m = this.memberOf(b);
    if (m) await this.#dropSlot(m.raid, m.slot);
  }

  async #writeSuperblocks(raid: Raid): Promise<void> {
    if (!raid.superblock) return;
    const sb: Superblock = {
      uuid: raid.uuid,
      name: raid.name,
      seq: raid.seq,
      blockSize: raid.blockSize,
      numBlocks: raid.numBlocks,
      dataOffset: Math.ceil(SB_RESERVED_BYTES / raid.blockSize),
      slots: raid.slots.map((s) => ({ uuid: s.bdev?.uuid ?? ZERO_UUID, configured: s.configured })),
    };
    const text = Buffer.from(`${SB_MAGIC}${JSON.stringify(sb)}\n`);
    const block = Buffer.alloc(Math.ceil(text.length / raid.blockSize) * raid.blockSize);
    text.copy(block);
    for (const s of raid.slots) {
      if (!s.bdev || !s.configured) continue;
      try {
        await memberWrite(s.bdev, 0, block);
      } catch (err) {
        this.log.warn("raid superblock write failed", { raid: raid.name, base: s.name, err: String(err) });
      }
    }
  }

  /**
   * raid_bdev_examine: a bdev carrying our superblock joins (or founds) the raid it names. A member
   * whose superblock is older than the raid's is stale and stays out, as SPDK's examine refuses
   * it with EEXIST.
   */
  async #examine(b: Bdev): Promise<void> {
    if (b.module === "raid" || b.claim) return;
    const sb = await readSuperblock(b);
    if (!sb) return;
    const at = sb.slots.findIndex((s) => s.uuid === b.uuid);
    if (at < 0 || !sb.slots[at]?.configured) return;
    let raid = this.#byName.get(sb.name);
    if (raid && raid.uuid !== sb.uuid) return;
    if (raid && sb.seq < raid.seq) {
      this.log.warn("Failed to examine bdev: File exists (stale raid superblock)", { bdev: b.name });
      return;
    }
    if (!raid || sb.seq > raid.seq) {
      if (raid?.state === "online") return; // A newer superblock under a running raid: leave it.
      if (raid) {
        // An older assembly in progress gives way to the newer superblock and lets its bases go.
        for (const s of raid.slots) if (s.bdev) this.registry.release(s.bdev, CLAIM_OWNER);
        this.#byName.delete(raid.name);
      }
      raid = new Raid(sb.name, sb.uuid, true, sb.slots.length);
      raid.seq = sb.seq;
      raid.blockSize = sb.blockSize;
      raid.numBlocks = sb.numBlocks;
      raid.expected = sb.slots.filter((s) => s.configured).length;
      sb.slots.forEach((s, i) => {
        const slot = raid?.slots[i] as Slot;
        // A slot the superblock records as gone is printed with the data area it reserves.
        Object.assign(slot, {
          name: null,
          uuid: s.configured ? s.uuid : ZERO_UUID,
          dataOffset: sb.dataOffset,
          dataSize: sb.numBlocks,
        });
      });
      this.#byName.set(raid.name, raid);
    }
    if (raid.state === "online") return;
    const slot = raid.slots[at] as Slot;
    if (slot.configured) return;
    this.registry.claim(b, "exclusive_write", CLAIM_OWNER);
    Object.assign(slot, { name: b.name, uuid: b.uuid, bdev: b, configured: true });
    if (raid.discovered >= raid.expected) {
      raid.seq--; // #goOnline bumps it; re-assembly does not change membership.
      await this.#goOnline(raid);
    }
  }
}

async function readSuperblock(b: Bdev): Promise<Superblock | undefined> {
  if (b.io.sizeBytes < b.blockSize) return undefined;
  let head: Buffer;
  try {
    head = await b.io.read(0, Math.min(b.io.sizeBytes, Math.max(b.blockSize, 4096)));
  } catch {
    return undefined;
  }
  if (!head.subarray(0, SB_MAGIC.length).equals(Buffer.from(SB_MAGIC))) return undefined;
  const end = head.indexOf(0x0a);
  try {
    return JSON.parse(
      head.subarray(SB_MAGIC.length, end < 0 ? undefined : end).toString("utf8"),
    ) as Superblock;
  } catch {
    return undefined;
  }
}

/**
 * I/O the raid submits to a member, counted in the member's bdev_get_iostat as the bdev layer
 * counts every I/O submitted to a bdev, whoever the consumer is.
 */
async function memberWrite(b: Bdev, offset: number, data: Uint8Array): Promise<void> {
  const started = performance.now();
  try {
    await b.io.write(offset, data);
  } catch (err) {
    b.stat.fail();
    throw err;
  }
  b.stat.complete("write", data.length, ((performance.now() - started) / 1000) * TICK_RATE);
}

async function memberRead(b: Bdev, offset: number, length: number): Promise<Buffer> {
  const started = performance.now();
  let data: Buffer;
  try {
    data = await b.io.read(offset, length);
  } catch (err) {
    b.stat.fail();
    throw err;
  }
  b.stat.complete("read", length, ((performance.now() - started) / 1000) * TICK_RATE);
  return data;
}

/**
 * raid_bdev_get_memory_domains: the domains of every configured member, one after another (not
 * deduplicated), asked at each call; none when no member has any.
 */
function memberDomains(raid: Raid): JsonValue | undefined {
  const all: JsonValue[] = [];
  for (const s of raid.slots) {
    if (!s.configured || !s.bdev) continue;
    const d = s.bdev.memoryDomains;
    if (Array.isArray(d)) all.push(...d);
  }
  return all.length > 0 ? all : undefined;
}

/**
 * raid1's data path (raid1.c). A write goes to every configured member and completes once all
 * of them have completed it (a member whose bdev holds the I/O, such as an NVMe-oF member while
 * its controller reconnects, holds the write); a member that fails it is failed out of the raid,
 * and the write succeeds when at least one member succeeded. A read goes to the member with the
 * fewest blocks of reads outstanding (lowest slot on a tie); if it fails, the other members are
 * tried in slot order and the data read is written back to the failing member, which is failed
 * only if that write fails too, or if no other member could serve the read.
 */
class Raid1Io implements BlockIo {
  /** raid1_io_channel.read_blocks_outstanding, per slot (one channel: the emulator's thread). */
  readonly #outstanding: number[];

  constructor(
    private readonly raid: Raid,
    private readonly fail: (slot: Slot, bdev: Bdev, err: unknown) => void,
  ) {
    this.#outstanding = raid.slots.map(() => 0);
  }

  get sizeBytes(): number {
    return this.raid.numBlocks * this.raid.blockSize;
  }

  async read(offset: number, length: number): Promise<Buffer> {
    checkRange(offset, length, this.sizeBytes);
    const bs = this.raid.blockSize;
    const first = Math.floor(offset / bs);
    const count = Math.ceil((offset + length) / bs) - first;
    const usable = (s: Slot) => Raids.readable(this.raid, s, first, count) && s.bdev !== null;
    // raid1_channel_next_read_base_bdev.
    let idx = -1;
    this.raid.slots.forEach((s, i) => {
      if (usable(s) && (idx < 0 || (this.#outstanding[i] ?? 0) < (this.#outstanding[idx] ?? 0))) idx = i;
    });
    const chosen = this.raid.slots[idx];
    const bdev = chosen?.bdev;
    if (!chosen || !bdev) throw new ErrnoError(Errno.EIO, "no readable raid member");
    const at = (s: Slot) => s.dataOffset * bs + offset;
    const from = at(chosen);
    this.#outstanding[idx] = (this.#outstanding[idx] ?? 0) + count;
    let firstErr: unknown;
    try {
      return await memberRead(bdev, from, length);
    } catch (err) {
      firstErr = err;
    } finally {
      this.#outstanding[idx] = (this.#outstanding[idx] ?? 0) - count;
    }
    // raid1_read_other_base_bdev, then raid1_correct_read_error.
    for (const other of this.raid.slots) {
      const source = other.bdev;
      if (other === chosen || !usable(other) || !source) continue;
      let data: Buffer;
      try {
        data = await memberRead(source, at(other), length);
      } catch {
        continue;
      }
      try {
        await memberWrite(bdev, from, data);
      } catch (err) {
        this.fail(chosen, bdev, err);
      }
      return data;
    }
    this.fail(chosen, bdev, firstErr);
    throw firstErr;
  }

  async write(offset: number, data: Uint8Array): Promise<void> {
    checkRange(offset, data.length, this.sizeBytes);
    const bs = this.raid.blockSize;
    await this.raid.lock.run(async () => {
      const members = this.raid.slots.filter((s) => s.configured && s.bdev);
      const bdevs = members.map((s) => s.bdev as Bdev);
      const results = await Promise.allSettled(
        members.map((s, i) => memberWrite(bdevs[i] as Bdev, s.dataOffset * bs + offset, data)),
      );
      let ok = 0;
      results.forEach((r, i) => {
        if (r.status === "fulfilled") ok++;
        else this.fail(members[i] as Slot, bdevs[i] as Bdev, r.reason);
      });
      if (ok === 0) throw new ErrnoError(Errno.EIO, "raid1 write failed on every member");
    });
  }
}
