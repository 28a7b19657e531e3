// Where the bytes of an exported namespace live: the file extent a loop device must map so the
// lab's initiator shows the same data the target serves. Asked of the target over its JSON-RPC
// socket (nvmf_get_subsystems -> the namespace's bdev -> bdev_get_bdevs), as an operator would.
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
 * contiguous file extent (an lvol's clusters, RAM), which a loop device cannot show.
 */
export type NamespaceBackingResolver = (subnqn: string, ns: NamespaceInfo) => Promise<NamespaceBacking>;

const SubsystemsSchema = v.array(
  v.looseObject({
    nqn: v.string(),
    namespaces: v.optional(v.array(v.looseObject({ nsid: v.number(), bdev_name: v.string() })), []),
  }),
);

const BdevsSchema = v.array(
  v.looseObject({
    name: v.string(),
    block_size: v.number(),
    num_blocks: v.number(),
    product_name: v.optional(v.string()),
    driver_specific: v.optional(v.looseObject({ aio: v.optional(v.looseObject({ filename: v.string() })) })),
  }),
);

/**
 * A resolver that asks the target over `rpc`. It knows AIO bdevs (a whole file, the only bdev
 * whose bytes SPDK itself keeps in one file extent); anything else is "unimplemented".
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
    const aio = bdev.driver_specific?.aio;
    if (aio === undefined) {
      throw new StorageError(
        "unimplemented",
        `namespace ${ns.nsid} of ${subnqn} is bdev ${bdev.name} (${bdev.product_name ?? "unknown"}); the lab initiator attaches only file-backed (AIO) namespaces`,
      );
    }
    return { path: aio.filename, offset: 0, sizeBytes: bdev.block_size * bdev.num_blocks };
  };
}
