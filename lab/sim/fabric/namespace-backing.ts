// Where the bytes of an exported namespace live: the file extent a loop device must map so the
// lab's initiator shows the same data the target serves. Asked of the target over its JSON-RPC
// socket (nvmf_get_subsystems -> the namespace's bdev -> bdev_get_bdevs), as an operator would,
// reading the emulator-only driver_specific.sim_extent (AIO files, and every lvol but snapshots:
// a thick lvol's run of drive clusters, or the file of its own a thin lvol or clone keeps).
import * as v from "valibot";
import { StorageError } from "../../../lib/errors.ts";
import type { SpdkRpc } from "../../../lib/spdk/client.ts";
import type { NamespaceInfo } from "../spdk/fabric-protocol.ts";

/** A contiguous byte range of a file that holds a namespace, front to back. */
export interface NamespaceBacking {
  readonly path: string;
  readonly offset: number;
  readonly sizeBytes: number;
}

/**
 * Resolves namespace `ns` of subsystem `subnqn` to its backing extent. Rejects with StorageError
 * "not-found" when the target no longer exports it and "unimplemented" when its bytes are not one
 * file extent a loop device may show (snapshots, which are read-only; RAM), with the reason.
 */
export type NamespaceBackingResolver = (subnqn: string, ns: NamespaceInfo) => Promise<NamespaceBacking>;

const SubsystemsSchema = v.array(
  v.looseObject({
    nqn: v.string(),
    namespaces: v.optional(v.array(v.looseObject({ nsid: v.number(), bdev_name: v.string() })), []),
  }),
);

const count = v.pipe(v.number(), v.integer(), v.minValue(0));

const BdevsSchema = v.array(
  v.looseObject({
    name: v.string(),
    block_size: v.number(),
    num_blocks: v.number(),
    product_name: v.optional(v.string()),
    driver_specific: v.optional(
      v.looseObject({
        aio: v.optional(v.looseObject({ filename: v.string() })),
        lvol: v.optional(v.looseObject({ snapshot: v.optional(v.boolean()) })),
        sim_extent: v.optional(v.object({ filename: v.string(), offset: count, length: count })),
      }),
    ),
  }),
);
type BdevJson = v.InferOutput<typeof BdevsSchema>[number];

/**
 * A resolver that asks the target over `rpc`. It maps a bdev's `driver_specific.sim_extent`
 * (printed by the emulator for AIO bdevs and for lvols other than snapshots on a store that is
 * not in RAM) and, for a target without that field, an AIO bdev's whole file. Anything else is
 * "unimplemented", with the reason in the message.
 */
export function spdkRpcBackingResolver(rpc: SpdkRpc): NamespaceBackingResolver {
  return async (subnqn, ns) => {
    let subsystems: v.InferOutput<typeof SubsystemsSchema>;
    try {
      subsystems = v.parse(SubsystemsSchema, await rpc.call("nvmf_get_subsystems", { nqn: subnqn }));
    } catch (err) {
      throw new StorageError("not-found", `target does not export ${subnqn}: ${(err as Error).message}`, {
        cause: err,
      });
    }
    const entry = subsystems[0]?.namespaces.find((n) => n.nsid === ns.nsid);
    if (entry === undefined) throw new StorageError("not-found", `${subnqn} has no namespace ${ns.nsid}`);
    const [bdev] = v.parse(BdevsSchema, await rpc.call("bdev_get_bdevs", { name: entry.bdev_name }));
    if (bdev === undefined) throw new StorageError("not-found", `bdev ${entry.bdev_name} is gone`);
    const extent = bdev.driver_specific?.sim_extent;
    if (extent !== undefined)
      return { path: extent.filename, offset: extent.offset, sizeBytes: extent.length };
    const aio = bdev.driver_specific?.aio;
    if (aio !== undefined) {
      return { path: aio.filename, offset: 0, sizeBytes: bdev.block_size * bdev.num_blocks };
    }
    throw new StorageError(
      "unimplemented",
      `namespace ${ns.nsid} of ${subnqn} is bdev ${bdev.name} (${bdev.product_name ?? "unknown"}), ${whyNot(bdev)}; the lab initiator attaches only AIO files and lvols (not snapshots) on a drive- or file-backed lvstore`,
    );
  };
}

/** Why a bdev without an extent cannot be shown by a loop device. */
function whyNot(bdev: BdevJson): string {
  const lvol = bdev.driver_specific?.lvol;
  if (lvol === undefined) return "whose bytes are not in one file";
  if (lvol.snapshot) return "a snapshot (read-only; a clone of it can be attached)";
  return "an lvol whose lvstore keeps its bytes in RAM (a malloc base)";
}
