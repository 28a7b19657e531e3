// fsdev_aio_* methods: AIO filesystem devices over host directories (what DPF's filesystem
// plugin hands to virtio-fs through SNAP).
import * as v from "valibot";
import type { App } from "../app.ts";
import { type MethodSpec, RUNTIME } from "../method-table.ts";
import { bool, DECODE_FAILED_PARAMS, decode, str, u32 } from "../params.ts";
import { ErrnoError, RpcCode, RpcError } from "../rpc-error.ts";

/** The fsdev methods of `app`. */
export function fsdevMethods(app: App): MethodSpec[] {
  return [
    {
      name: "fsdev_aio_create",
      states: RUNTIME,
      handler: (req) => {
        const p = decode(
          req,
          v.strictObject({
            name: str,
            root_path: str,
            enable_xattr: v.optional(bool),
            enable_writeback_cache: v.optional(bool),
            max_write: v.optional(u32),
            skip_rw: v.optional(bool),
          }),
          DECODE_FAILED_PARAMS,
        );
        try {
          app.fsdevs.create({
            name: p.name,
            rootPath: p.root_path,
            xattrEnabled: p.enable_xattr ?? false,
            writebackCacheEnabled: p.enable_writeback_cache ?? false,
            maxWrite: p.max_write ?? 0x20000,
            skipRw: p.skip_rw ?? false,
          });
        } catch (err) {
          // spdk_fsdev_aio_create's failures come back as -32603 with the strerror text.
          if (err instanceof ErrnoError) throw RpcError.coded(RpcCode.internalError, err.errno);
          throw err;
        }
        return p.name;
      },
    },
    {
      name: "fsdev_aio_delete",
      states: RUNTIME,
      handler: async (req, ctx) => {
        const p = decode(req, v.strictObject({ name: str }), DECODE_FAILED_PARAMS);
        await ctx.defer();
        app.fsdevs.delete(p.name);
        return true;
      },
    },
  ];
}
