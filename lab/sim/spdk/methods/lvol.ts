// bdev_lvol_* methods: lvstores and lvols (thin/thick), resize, snapshots and clones, shallow
// copies, with v25.05.1's split between synchronous errors (code -errno) and asynchronous ones
// (-32602 with the strerror text, -32603 for a failed delete, a shallow copy's in its check).
import * as v from "valibot";
import type { App } from "../app.ts";
import type { LoadedStore, ShallowCopy } from "../lvol-store.ts";
import { type MethodSpec, RUNTIME } from "../method-table.ts";
import { bool, DECODE_FAILED_INTERNAL, decode, decodeOptional, str, u32, u64 } from "../params.ts";
import { Errno, ErrnoError, errnoOf, RpcCode, RpcError, strerror } from "../rpc-error.ts";

const MIB = 1024 * 1024;
const CLEAR_METHODS = ["none", "unmap", "write_zeroes"];
const LVOL_CLEAR_METHODS = [...CLEAR_METHODS, "default"];

/** Runs an asynchronous lvol step, turning its ErrnoError into `code` + strerror. */
async function completion<T>(code: number, fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (err) {
    if (err instanceof RpcError) throw err;
    throw RpcError.coded(code, errnoOf(err));
  }
}

/** Runs synchronous checks, turning their ErrnoError into code -errno. */
function sync<T>(fn: () => T): T {
  try {
    return fn();
  } catch (err) {
    if (err instanceof ErrnoError) throw RpcError.errno(err.errno);
    throw err;
  }
}

/** What bdev_lvol_check_shallow_copy reports of one operation (rpc_shallow_copy_status). */
interface ShallowCopyStatus {
  copied: number;
  readonly total: number;
  /** 0 while running or once complete; -errno once failed. */
  result: number;
}

/** The lvol methods of `app`. */
export function lvolMethods(app: App): MethodSpec[] {
  const { lvols } = app;
  // g_shallow_copy_count and g_shallow_copy_status_list: per process, so per App here. A status
  // stays until a check has reported its terminal state (or the process ends).
  let shallowCopyCount = 0;
  const shallowCopies = new Map<number, ShallowCopyStatus>();

  /** vbdev_get_lvol_store_by_uuid_xor_name: EINVAL for none or both, ENODEV when absent. */
  const storeXor = (uuid: string | undefined, name: string | undefined): LoadedStore => {
    if ((uuid === undefined) === (name === undefined)) throw RpcError.errno(Errno.EINVAL);
    const s = uuid !== undefined ? lvols.byUuid(uuid) : lvols.byName(name as string);
    if (!s) throw RpcError.errno(Errno.ENODEV);
    return s;
  };
  const lvolOf = (name: string) => {
    const found = lvols.lvolByBdev(name);
    if (!found) throw RpcError.errno(Errno.ENODEV);
    return found;
  };

  return [
    {
      name: "bdev_lvol_create_lvstore",
      states: RUNTIME,
      handler: async (req, ctx) => {
        const p = decode(
          req,
          v.strictObject({
            bdev_name: str,
            lvs_name: str,
            cluster_sz: v.optional(u32),
            clear_method: v.optional(str),
            num_md_pages_per_cluster_ratio: v.optional(u32),
            md_page_size: v.optional(u32),
          }),
          DECODE_FAILED_INTERNAL,
        );
        if (p.clear_method !== undefined && !CLEAR_METHODS.includes(p.clear_method.toLowerCase())) {
          throw new RpcError(-Errno.EINVAL, "Invalid clear_method parameter");
        }
        sync(() => lvols.checkCreate(p.bdev_name, p.lvs_name));
        await ctx.defer();
        const store = await completion(RpcCode.invalidParams, () =>
          lvols.create(p.bdev_name, p.lvs_name, p.cluster_sz || undefined),
        );
        return store.bs.uuid;
      },
    },
    {
      name: "bdev_lvol_get_lvstores",
      states: RUNTIME,
      handler: (req) => {
        const p = decodeOptional(
          req,
          v.strictObject({ uuid: v.optional(str), lvs_name: v.optional(str) }),
          DECODE_FAILED_INTERNAL,
        );
        const stores =
          p.uuid === undefined && p.lvs_name === undefined ? lvols.list() : [storeXor(p.uuid, p.lvs_name)];
        return stores.map((s) => ({
          uuid: s.bs.uuid,
          name: s.bs.name,
          base_bdev: s.base.name,
          total_data_clusters: s.bs.layout.totalDataClusters,
          free_clusters: s.bs.freeClusters,
          block_size: s.bs.blockSize,
          cluster_size: s.bs.clusterSize,
        }));
      },
    },
    {
      name: "bdev_lvol_delete_lvstore",
      states: RUNTIME,
      handler: async (req, ctx) => {
        const p = decode(
          req,
          v.strictObject({ uuid: v.optional(str), lvs_name: v.optional(str) }),
          DECODE_FAILED_INTERNAL,
        );
        const store = storeXor(p.uuid, p.lvs_name);
        await ctx.defer();
        if (!lvols.list().includes(store)) throw RpcError.coded(RpcCode.invalidParams, Errno.ENODEV);
        await completion(RpcCode.invalidParams, () => lvols.destroy(store));
        return true;
      },
    },
    {
      name: "bdev_lvol_create",
      states: RUNTIME,
      handler: async (req, ctx) => {
        const p = decode(
          req,
          v.strictObject({
            uuid: v.optional(str),
            lvs_name: v.optional(str),
            lvol_name: str,
            size_in_mib: u64,
            thin_provision: v.optional(bool),
            clear_method: v.optional(str),
          }),
          DECODE_FAILED_INTERNAL,
        );
        const store = storeXor(p.uuid, p.lvs_name);
        if (p.clear_method !== undefined && !LVOL_CLEAR_METHODS.includes(p.clear_method.toLowerCase())) {
          throw new RpcError(-Errno.EINVAL, "Invalid clean_method option");
        }
        // The name is checked before the blob is created: a duplicate fails synchronously.
        sync(() => store.bs.checkNewName(p.lvol_name));
        await ctx.defer();
        const lvol = await completion(RpcCode.invalidParams, () =>
          lvols.createLvol(store, p.lvol_name, p.size_in_mib * MIB, p.thin_provision === true),
        );
        return lvol.uuid;
      },
    },
    {
      name: "bdev_lvol_get_lvols",
      states: RUNTIME,
      handler: (req) => {
        const p = decodeOptional(
          req,
          v.strictObject({ lvs_uuid: v.optional(str), lvs_name: v.optional(str) }),
          DECODE_FAILED_INTERNAL,
        );
        const stores =
          p.lvs_uuid === undefined && p.lvs_name === undefined
            ? lvols.list()
            : [storeXor(p.lvs_uuid, p.lvs_name)];
        return stores.flatMap((s) =>
          s.bs.lvols.map((l) => ({
            alias: `${s.bs.name}/${l.name}`,
            uuid: l.uuid,
            name: l.name,
            is_thin_provisioned: l.thin,
            is_snapshot: l.snapshot,
            is_clone: l.parent !== null,
            is_esnap_clone: false,
            is_degraded: false,
            num_allocated_clusters: l.allocatedClusters,
            lvs: { name: s.bs.name, uuid: s.bs.uuid },
          })),
        );
      },
    },
    {
      name: "bdev_lvol_delete",
      states: RUNTIME,
      handler: async (req, ctx) => {
        const p = decode(req, v.strictObject({ name: str }), DECODE_FAILED_INTERNAL);
        const { store, lvol } = lvolOf(p.name);
        await ctx.defer();
        if (!store.bs.lvols.includes(lvol)) throw RpcError.coded(RpcCode.internalError, Errno.ENODEV);
        await completion(RpcCode.internalError, () => lvols.deleteLvol(store, lvol));
        return true;
      },
    },
    {
      name: "bdev_lvol_resize",
      states: RUNTIME,
      handler: async (req, ctx) => {
        const p = decode(req, v.strictObject({ name: str, size_in_mib: u64 }), DECODE_FAILED_INTERNAL);
        const { store, lvol } = lvolOf(p.name);
        await ctx.defer();
        await completion(RpcCode.invalidParams, () => lvols.resize(store, lvol, p.size_in_mib * MIB));
        return true;
      },
    },
    {
      name: "bdev_lvol_snapshot",
      states: RUNTIME,
      handler: async (req, ctx) => {
        const p = decode(req, v.strictObject({ lvol_name: str, snapshot_name: str }), DECODE_FAILED_INTERNAL);
        const { store, lvol } = lvolOf(p.lvol_name);
        await ctx.defer();
        const snap = await completion(RpcCode.invalidParams, () =>
          lvols.snapshot(store, lvol, p.snapshot_name),
        );
        return snap.uuid;
      },
    },
    {
      name: "bdev_lvol_clone",
      states: RUNTIME,
      handler: async (req, ctx) => {
        const p = decode(
          req,
          v.strictObject({ snapshot_name: str, clone_name: str }),
          DECODE_FAILED_INTERNAL,
        );
        const { store, lvol } = lvolOf(p.snapshot_name);
        await ctx.defer();
        const c = await completion(RpcCode.invalidParams, () => lvols.clone(store, lvol, p.clone_name));
        return c.uuid;
      },
    },
    {
      name: "bdev_lvol_start_shallow_copy",
      states: RUNTIME,
      // Synchronous in SPDK: the reply (an id, or an error) is sent before the copy does any I/O.
      handler: (req, ctx) => {
        const p = decode(
          req,
          v.strictObject({ src_lvol_name: str, dst_bdev_name: str }),
          DECODE_FAILED_INTERNAL,
        );
        // An unknown source, or a bdev that is not an lvol: -19, and no id is used up.
        const { store, lvol } = lvolOf(p.src_lvol_name);
        const id = ++shallowCopyCount;
        let copy: ShallowCopy;
        try {
          copy = lvols.beginShallowCopy(store, lvol, p.dst_bdev_name, `lvol-shallow-copy:${id}`);
        } catch (err) {
          // vbdev_lvol_shallow_copy's rc: -32602 with strerror (an unknown destination is
          // "No such device", a claimed one "Operation not permitted"); the id stays used.
          throw RpcError.coded(RpcCode.invalidParams, errnoOf(err));
        }
        const status: ShallowCopyStatus = { copied: 0, total: copy.totalClusters, result: 0 };
        shallowCopies.set(id, status);
        void copy
          .run(
            () => ctx.defer(),
            (n) => {
              status.copied = n;
            },
          )
          .catch((err: unknown) => {
            status.result = -errnoOf(err);
          });
        return { operation_id: id };
      },
    },
    {
      name: "bdev_lvol_check_shallow_copy",
      states: RUNTIME,
      handler: (req) => {
        const p = decode(req, v.strictObject({ operation_id: u32 }), DECODE_FAILED_INTERNAL);
        const status = shallowCopies.get(p.operation_id);
        if (!status) throw RpcError.errno(Errno.ENODEV);
        const { copied, total, result } = status;
        const out = { copied_clusters: copied, total_clusters: total };
        // rpc_bdev_lvol_check_shallow_copy's three branches; the terminal ones drop the status.
        if (copied < total && result === 0) return { ...out, state: "in progress" };
        shallowCopies.delete(p.operation_id);
        if (copied === total && result === 0) return { ...out, state: "complete" };
        return { ...out, state: "error", error: strerror(-result) };
      },
    },
  ];
}
