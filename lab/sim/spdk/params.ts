// Parameter decoding the way SPDK's spdk_json_decode_object does it, on valibot: JSON types are
// strict (no string for a number), integers are range-checked, and an unknown key fails the strict
// decoder but not the relaxed one. Each method chooses the error its SPDK handler sends.
import * as v from "valibot";
import type { RpcRequest } from "./method-table.ts";
import { RpcCode, RpcError } from "./rpc-error.ts";

const int = (min: number, max: number) => v.pipe(v.number(), v.integer(), v.minValue(min), v.maxValue(max));

/** spdk_json_decode_uint8. */
export const u8 = int(0, 0xff);
/** spdk_json_decode_uint16. */
export const u16 = int(0, 0xffff);
/** spdk_json_decode_uint32. */
export const u32 = int(0, 0xffff_ffff);
/** spdk_json_decode_int32. */
export const i32 = int(-0x8000_0000, 0x7fff_ffff);
/** spdk_json_decode_uint64 (limited to what a double holds exactly, ample for sizes and ids). */
export const u64 = int(0, Number.MAX_SAFE_INTEGER);
/** spdk_json_decode_string. */
export const str = v.string();
/** spdk_json_decode_bool. */
export const bool = v.boolean();

/** -32602 "spdk_json_decode_object failed" (iobuf, keyring, fsdev...). */
export const DECODE_FAILED_PARAMS = () =>
  new RpcError(RpcCode.invalidParams, "spdk_json_decode_object failed");
/** -32603 "spdk_json_decode_object failed" (bdev, bdev_nvme, lvol, malloc, aio...). */
export const DECODE_FAILED_INTERNAL = () =>
  new RpcError(RpcCode.internalError, "spdk_json_decode_object failed");
/** -32602 "Invalid parameters" (nvmf, rpc_get_methods, spdk_kill_instance...). */
export const INVALID_PARAMS = () => RpcError.invalidParams();

/**
 * Decodes `req.params` with `schema` (a valibot object schema; strictObject for SPDK's strict
 * decoder, looseObject for its relaxed one). Absent params, non-object params and params with a
 * repeated key all fail like SPDK's decoder does, with the error `fail` builds.
 */
export function decode<S extends v.GenericSchema>(
  req: RpcRequest,
  schema: S,
  fail: () => RpcError,
): v.InferOutput<S> {
  const p = req.params;
  if (p === undefined || p === null || typeof p !== "object" || Array.isArray(p) || req.duplicateKeys) {
    throw fail();
  }
  const r = v.safeParse(schema, p);
  if (!r.success) throw fail();
  return r.output;
}

/**
 * Like decode(), for methods whose params are optional: absent params give `{}` (the handler's
 * defaults), present params must decode.
 */
export function decodeOptional<S extends v.GenericSchema>(
  req: RpcRequest,
  schema: S,
  fail: () => RpcError,
): Partial<v.InferOutput<S>> {
  if (req.params === undefined) return {};
  return decode(req, schema, fail);
}

/**
 * For methods that take no parameters at all: any params, even `{}`, is rejected with -32602 and
 * the method's own message (SPDK checks `params != NULL`).
 */
export function noParams(req: RpcRequest, message: string): void {
  if (req.params !== undefined) throw new RpcError(RpcCode.invalidParams, message);
}
