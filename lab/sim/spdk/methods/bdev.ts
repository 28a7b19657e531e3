// Generic bdev methods and the simple bdev modules: bdev_get_bdevs, malloc (zeroed RAM) and AIO
// (a file or block device) bdevs, bdev_wait_for_examine.
import { randomUUID } from "node:crypto";
import { readFileSync, statSync } from "node:fs";
import * as v from "valibot";
import type { App } from "../app.ts";
import { Bdev, IO_TYPES, SYSTEM_AND_ACCEL_DOMAINS } from "../bdev.ts";
import { FileExtentIo, MemoryIo, NullIo } from "../block-io.ts";
import { TICK_RATE } from "../core-mask.ts";
import type { JsonValue } from "../json-stream.ts";
import { type MethodSpec, RUNTIME } from "../method-table.ts";
import {
  bool,
  DECODE_FAILED_INTERNAL,
  decode,
  decodeOptional,
  i32,
  noParams,
  str,
  u32,
  u64,
} from "../params.ts";
import { QosThrottle } from "../qos.ts";
import { Errno, ErrnoError, RpcError } from "../rpc-error.ts";

const UUID_RE = /^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$/;
const uuidStr = v.pipe(v.string(), v.regex(UUID_RE));

const QOS_KEYS = ["rw_ios_per_sec", "rw_mbytes_per_sec", "r_mbytes_per_sec", "w_mbytes_per_sec"] as const;
/** SPDK_BDEV_QOS_MIN_IOS_PER_SEC. */
const QOS_IOPS_STEP = 1000;

/** spdk_get_ticks() of the app: ticks since it started, at the emulator's tick rate. */
function appTicks(app: App): number {
  return Math.max(0, Math.round(((app.config.clock.now() - app.startedAt) / 1000) * TICK_RATE));
}

/**
 * bdev_<module>_delete for the simple modules (null, malloc, aio), which v25.05.1 handles alike:
 * the bdev named (or aliased) `name` must belong to that module, else -19 ENODEV; the reply
 * `true` comes once it is unregistered, answered asynchronously (after ctx.defer()).
 */
function moduleBdevDelete(app: App, module: "null" | "malloc" | "aio"): MethodSpec {
  const { registry } = app;
  return {
    name: `bdev_${module}_delete`,
    states: RUNTIME,
    handler: async (req, ctx) => {
      const p = decode(req, v.strictObject({ name: str }), DECODE_FAILED_INTERNAL);
      const bdev = registry.get(p.name);
      if (bdev?.module !== module) throw RpcError.errno(Errno.ENODEV);
      await ctx.defer();
      await registry.unregister(bdev);
      return true;
    },
  };
}

/**
 * driver_specific of bdev_get_iostat: only modules with dump_device_stat_json print it, and of
 * ours only the NVMe bdev module does (empty unless its error statistics are enabled).
 */
function deviceStat(b: Bdev): { driver_specific?: JsonValue } {
  return b.module === "nvme" ? { driver_specific: {} } : {};
}

/** The bdev layer methods of `app`. */
export function bdevMethods(app: App): MethodSpec[] {
  const { registry } = app;
  return [
    {
      name: "bdev_get_bdevs",
      states: RUNTIME,
      handler: (req) => {
        const p = decodeOptional(
          req,
          v.strictObject({ name: v.optional(str), timeout: v.optional(u64) }),
          DECODE_FAILED_INTERNAL,
        );
        if (p.name === undefined) return registry.list().map((b) => b.toJson());
        const found = registry.get(p.name);
        if (found) return [found.toJson()];
        if (!p.timeout) throw RpcError.errno(Errno.ENODEV);
        return waitForBdev(app, p.name, p.timeout);
      },
    },
    {
      // lib/bdev/bdev_rpc.c rpc_bdev_get_iostat: one bdev by name or alias, or all of them; with
      // per_channel, that bdev's channels (one per poll group thread that opened it).
      name: "bdev_get_iostat",
      states: RUNTIME,
      handler: (req) => {
        const p = decodeOptional(
          req,
          v.strictObject({
            name: v.optional(str),
            per_channel: v.optional(bool),
            reset_mode: v.optional(v.picklist(["all", "maxmin", "none"])),
          }),
          DECODE_FAILED_INTERNAL,
        );
        if (p.per_channel && p.name === undefined) throw RpcError.errno(Errno.EINVAL);
        const one = p.name === undefined ? undefined : registry.get(p.name);
        if (p.name !== undefined && !one) throw RpcError.errno(Errno.ENODEV);
        const head = { tick_rate: TICK_RATE, ticks: appTicks(app) };
        const reset = (b: Bdev) => {
          if (p.reset_mode === "all" || p.reset_mode === "maxmin") b.stat.reset(p.reset_mode);
        };
        if (one && p.per_channel) {
          // The emulator serves every namespace's I/O from the first poll group's thread (id 2,
          // after app_thread): one channel once the bdev has seen I/O, none before.
          const channels = one.stat.touched ? [{ thread_id: 2, ...one.stat.toJson(false) }] : [];
          reset(one);
          return { ...head, name: one.name, channels };
        }
        const bdevs = (one ? [one] : registry.list()).map((b) => {
          const entry = { name: b.name, ...b.stat.toJson(true), ...deviceStat(b) };
          reset(b);
          return entry;
        });
        return { ...head, bdevs };
      },
    },
    {
      // lib/bdev/bdev_rpc.c rpc_bdev_set_qos_limit and bdev.c spdk_bdev_set_qos_rate_limits.
      name: "bdev_set_qos_limit",
      states: RUNTIME,
      handler: (req) => {
        const p = decode(
          req,
          v.strictObject({
            name: str,
            rw_ios_per_sec: v.optional(u64),
            rw_mbytes_per_sec: v.optional(u64),
            r_mbytes_per_sec: v.optional(u64),
            w_mbytes_per_sec: v.optional(u64),
          }),
          DECODE_FAILED_INTERNAL,
        );
        // The bdev is opened before the limits are looked at.
        const bdev = registry.get(p.name);
        if (!bdev) throw RpcError.errno(Errno.ENODEV);
        const given = QOS_KEYS.filter((k) => p[k] !== undefined);
        if (given.length === 0) throw new RpcError(-Errno.EINVAL, "No rate limits specified");
        const next = { ...bdev.rateLimits };
        for (const k of given) {
          const value = p[k] as number;
          // IOPS go in steps of SPDK_BDEV_QOS_MIN_IOS_PER_SEC: anything else is rounded up (logged
          // by SPDK as a notice, not refused).
          next[k] = k === "rw_ios_per_sec" ? Math.ceil(value / QOS_IOPS_STEP) * QOS_IOPS_STEP : value;
        }
        bdev.rateLimits = next;
        if (bdev.qos) bdev.qos.setLimits(next);
        else bdev.qos = new QosThrottle(app.config.clock, next);
        return true;
      },
    },
    {
      name: "bdev_wait_for_examine",
      states: RUNTIME,
      handler: (req) => {
        noParams(req, "bdev_wait_for_examine requires no parameters");
        // Examine runs inside registration, so nothing is ever pending here.
        return true;
      },
    },
    {
      name: "bdev_malloc_create",
      states: RUNTIME,
      handler: (req) => {
        const p = decode(
          req,
          v.strictObject({
            name: v.optional(str),
            num_blocks: u64,
            block_size: u32,
            physical_block_size: v.optional(u32),
            uuid: v.optional(uuidStr),
            optimal_io_boundary: v.optional(u32),
            md_size: v.optional(u32),
            md_interleave: v.optional(bool),
            dif_type: v.optional(u32),
            dif_is_head_of_md: v.optional(bool),
            dif_pi_format: v.optional(u32),
            numa_id: v.optional(i32),
          }),
          DECODE_FAILED_INTERNAL,
        );
        if (p.block_size % 512 !== 0 || p.block_size === 0 || p.num_blocks === 0)
          throw RpcError.errno(Errno.EINVAL);
        // The auto-name counter only moves for unnamed bdevs, and may land on a taken name.
        const name = p.name ?? `Malloc${app.mallocCount++}`;
        if (registry.taken(name) || (p.uuid && registry.taken(p.uuid))) throw RpcError.errno(Errno.EEXIST);
        const bdev = new Bdev({
          name,
          uuid: p.uuid?.toLowerCase() ?? randomUUID(),
          module: "malloc",
          productName: "Malloc disk",
          blockSize: p.block_size,
          io: new MemoryIo(p.num_blocks * p.block_size),
          ioTypes: IO_TYPES.malloc,
          memoryDomains: SYSTEM_AND_ACCEL_DOMAINS,
          driverSpecific: () => ({}),
        });
        return registry.register(bdev).then(() => name);
      },
    },
    {
      // bdev_null: no medium at all (writes dropped, reads zeros); v25.05.1 checks the block
      // size (a multiple of 512) and the count before registering, EEXIST for a taken name.
      name: "bdev_null_create",
      states: RUNTIME,
      handler: (req) => {
        const p = decode(
          req,
          v.strictObject({
            name: str,
            num_blocks: u64,
            block_size: u32,
            physical_block_size: v.optional(u32),
            uuid: v.optional(uuidStr),
            md_size: v.optional(u32),
            dif_type: v.optional(u32),
            dif_is_head_of_md: v.optional(bool),
            dif_pi_format: v.optional(u32),
          }),
          DECODE_FAILED_INTERNAL,
        );
        if (p.block_size % 512 !== 0 || p.block_size === 0 || p.num_blocks === 0)
          throw RpcError.errno(Errno.EINVAL);
        if (registry.taken(p.name) || (p.uuid && registry.taken(p.uuid))) throw RpcError.errno(Errno.EEXIST);
        const bdev = new Bdev({
          name: p.name,
          uuid: p.uuid?.toLowerCase() ?? randomUUID(),
          module: "null",
          productName: "Null disk",
          blockSize: p.block_size,
          io: new NullIo(p.num_blocks * p.block_size),
          ioTypes: IO_TYPES.null,
          memoryDomains: SYSTEM_AND_ACCEL_DOMAINS,
          driverSpecific: () => ({}),
        });
        return registry.register(bdev).then(() => p.name);
      },
    },
    moduleBdevDelete(app, "null"),
    moduleBdevDelete(app, "malloc"),
    {
      name: "bdev_aio_create",
      states: RUNTIME,
      handler: async (req) => {
        const p = decode(
          req,
          v.strictObject({
            name: str,
            filename: str,
            block_size: v.optional(u32),
            readonly: v.optional(bool),
            fallocate: v.optional(bool),
            uuid: v.optional(uuidStr),
            nowait: v.optional(bool),
          }),
          DECODE_FAILED_INTERNAL,
        );
        const dev = probeFile(p.filename);
        let blockSize = p.block_size ?? 0;
        if (blockSize === 0) {
          if (dev.detectedBlockSize === 0) throw RpcError.errno(Errno.EINVAL);
          blockSize = dev.detectedBlockSize;
        } else if (blockSize < dev.detectedBlockSize) {
          throw RpcError.errno(Errno.EINVAL);
        }
        if (blockSize < 512 || (blockSize & (blockSize - 1)) !== 0) throw RpcError.errno(Errno.EINVAL);
        if (registry.taken(p.name)) throw RpcError.errno(Errno.EEXIST);
        const size = Math.floor(dev.sizeBytes / blockSize) * blockSize;
        const io = new FileExtentIo(p.filename, 0, size, { readonly: p.readonly === true });
        const bdev = new Bdev({
          name: p.name,
          uuid: p.uuid?.toLowerCase() ?? randomUUID(),
          module: "aio",
          productName: "AIO disk",
          blockSize,
          io,
          ioTypes: IO_TYPES.aio,
          driverSpecific: () => ({
            aio: {
              filename: p.filename,
              block_size_override: p.block_size !== undefined && p.block_size !== 0,
              readonly: p.readonly === true,
              fallocate: p.fallocate === true,
            },
          }),
          onRemoved: () => io.close(),
        });
        try {
          await registry.register(bdev);
        } catch (err) {
          io.close();
          throw err;
        }
        return p.name;
      },
    },
    moduleBdevDelete(app, "aio"),
  ];
}

/**
 * Size and logical block size of an AIO target. A regular file has no detectable block size
 * (SPDK's BLKSSZGET fails), a block device reports its queue's. ErrnoError from open/stat.
 */
function probeFile(path: string): { sizeBytes: number; detectedBlockSize: number } {
  let st: ReturnType<typeof statSync>;
  try {
    st = statSync(path);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    throw RpcError.errno(code === "ENOENT" ? Errno.ENOENT : code === "EACCES" ? Errno.EACCES : Errno.EIO);
  }
  if (!st.isBlockDevice()) return { sizeBytes: st.size, detectedBlockSize: 0 };
  // Linux dev_t: 12+20 bit major, 8+12 bit minor, interleaved.
  const r = BigInt(st.rdev);
  const major = ((r >> 8n) & 0xfffn) | ((r >> 32n) & ~0xfffn);
  const minor = (r & 0xffn) | ((r >> 12n) & ~0xffn);
  const sys = `/sys/dev/block/${major}:${minor}`;
  try {
    const sectors = Number(readFileSync(`${sys}/size`, "utf8").trim());
    const lbs = Number(readFileSync(`${sys}/queue/logical_block_size`, "utf8").trim());
    return { sizeBytes: sectors * 512, detectedBlockSize: lbs };
  } catch {
    throw new ErrnoError(Errno.EIO, `cannot size block device ${path}`);
  }
}

/** Waits up to `timeoutMs` for a bdev to appear; -110 (ETIMEDOUT) when it does not. */
async function waitForBdev(app: App, name: string, timeoutMs: number): Promise<unknown> {
  const deadline = app.config.clock.now() + timeoutMs;
  while (app.config.clock.now() < deadline) {
    await app.config.clock.sleep(10);
    const b = app.registry.get(name);
    if (b) return [b.toJson()];
  }
  throw RpcError.errno(Errno.ETIMEDOUT);
}
