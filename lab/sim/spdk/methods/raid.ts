// The bdev_raid_* methods (module/bdev/raid/bdev_raid_rpc.c), raid1 only. Error codes follow the
// records: most decode failures are -32700 (SPDK_JSONRPC_ERROR_PARSE_ERROR), add_base_bdev's is
// -32603; create failures read "Failed to create RAID bdev <name>: <strerror>".
import * as v from "valibot";
import type { App } from "../app.ts";
import { DUPLICATE_KEY_PREFIX, type JsonValue } from "../json-stream.ts";
import { ANY_STATE, type MethodSpec, RUNTIME } from "../method-table.ts";
import { bool, DECODE_FAILED_INTERNAL, decode, decodeOptional, str, u32 } from "../params.ts";
import { Errno, errnoOf, RpcCode, RpcError, strerror } from "../rpc-error.ts";

/** SPDK_JSONRPC_ERROR_PARSE_ERROR with the decoder's message. */
const DECODE_FAILED_PARSE = () => new RpcError(RpcCode.parseError, "spdk_json_decode_object failed");

const UUID_RE = /^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$/;

/** g_raid_level_names: an unknown name fails the decoder, so it is part of the schema. */
const LEVEL = v.picklist(["raid0", "0", "raid1", "1", "raid5f", "5f", "concat"]);

const CATEGORIES = ["all", "online", "configuring", "offline"] as const;

/** The raid methods of `app`. */
export function raidMethods(app: App): MethodSpec[] {
  const { raids } = app;
  return [
    {
      // Registered for both states: options may be set before framework_start_init too.
      name: "bdev_raid_set_options",
      states: ANY_STATE,
      handler: (req) => {
        const p = decodeOptional(
          req,
          v.strictObject({
            process_window_size_kb: v.optional(u32),
            process_max_bandwidth_mb_sec: v.optional(u32),
          }),
          DECODE_FAILED_PARSE,
        );
        const next = { ...raids.options, ...p };
        // raid_bdev_set_opts: a zero window could never make progress.
        if (next.process_window_size_kb === 0) throw RpcError.errno(Errno.EINVAL);
        raids.options = next;
        return true;
      },
    },
    {
      name: "bdev_raid_remove_base_bdev",
      states: RUNTIME,
      handler: async (req, ctx) => {
        const p = decode(req, v.strictObject({ name: str }), DECODE_FAILED_PARSE);
        try {
          await ctx.defer();
          await raids.removeBase(p.name);
        } catch (err) {
          throw new RpcError(-errnoOf(err), "Failed to remove base bdev from raid bdev");
        }
        return true;
      },
    },
    {
      name: "bdev_raid_add_base_bdev",
      states: RUNTIME,
      handler: async (req, ctx) => {
        const p = decode(req, v.strictObject({ raid_bdev: str, base_bdev: str }), DECODE_FAILED_INTERNAL);
        if (!raids.get(p.raid_bdev)) {
          throw new RpcError(-Errno.ENODEV, `raid bdev ${p.raid_bdev} is not found in config`);
        }
        try {
          await raids.addBase(p.raid_bdev, p.base_bdev);
        } catch (err) {
          const e = errnoOf(err);
          throw new RpcError(
            -e,
            `Failed to add base bdev ${p.base_bdev} to RAID bdev ${p.raid_bdev}: ${strerror(e)}`,
          );
        }
        await ctx.defer();
        return true;
      },
    },
    {
      name: "bdev_raid_delete",
      states: RUNTIME,
      handler: async (req, ctx) => {
        const p = decode(req, v.strictObject({ name: str }), DECODE_FAILED_PARSE);
        if (!raids.get(p.name)) throw new RpcError(-Errno.ENODEV, `raid bdev ${p.name} not found`);
        await ctx.defer();
        await raids.delete(p.name);
        return true;
      },
    },
    {
      name: "bdev_raid_create",
      states: RUNTIME,
      handler: async (req, ctx) => {
        const p = decode(
          req,
          v.strictObject({
            name: str,
            raid_level: LEVEL,
            strip_size_kb: v.optional(u32),
            base_bdevs: v.array(str),
            uuid: v.optional(v.pipe(str, v.regex(UUID_RE))),
            superblock: v.optional(bool),
          }),
          DECODE_FAILED_PARSE,
        );
        const fail = (errno: number) =>
          new RpcError(-errno, `Failed to create RAID bdev ${p.name}: ${strerror(errno)}`);
        if (p.base_bdevs.some((b) => b.length === 0)) {
          throw new RpcError(-Errno.EINVAL, `The base bdev name cannot be empty: ${strerror(Errno.EINVAL)}`);
        }
        const strip = p.strip_size_kb ?? 0;
        if (p.raid_level === "raid1" || p.raid_level === "1") {
          // raid1 has no strips ("Strip size is not supported by raid1").
          if (strip !== 0) throw fail(Errno.EINVAL);
        } else {
          // Striped levels need a strip ("Invalid strip size 0"); with one, SPDK would build them,
          // the emulator does not.
          if (strip === 0) throw fail(Errno.EINVAL);
          throw fail(Errno.EOPNOTSUPP);
        }
        try {
          await raids.create(p.name, p.base_bdevs, p.superblock ?? false, p.uuid?.toLowerCase());
        } catch (err) {
          throw fail(errnoOf(err));
        }
        await ctx.defer();
        return true;
      },
    },
    {
      name: "bdev_raid_get_bdevs",
      states: RUNTIME,
      handler: (req) => {
        const p = decode(req, v.strictObject({ category: str }), DECODE_FAILED_PARSE);
        const category = p.category as (typeof CATEGORIES)[number];
        if (!CATEGORIES.includes(category)) throw RpcError.errno(Errno.EINVAL);
        return raids
          .list()
          .filter((r) => category === "all" || r.state === category)
          .map((r) => {
            // SPDK writes "uuid" itself and again inside raid_bdev_write_info_json.
            const { uuid, ...rest } = r.info();
            const out: { [key: string]: JsonValue } = { name: r.name, uuid: uuid ?? null };
            out[`${DUPLICATE_KEY_PREFIX}uuid`] = uuid ?? null;
            return { ...out, ...rest };
          });
      },
    },
  ];
}
