// Test and lab support for the DPU plugin, imported by tests and the lab only: the target side of a
// DISTORT volume set up the way the agent does it, a map-backed SecretReader, a recording SNAP
// connection, and BlockDevices on loop devices over the target's file-backed namespaces.
import * as v from "valibot";
import { StorageError } from "../lib/errors.ts";
import { type Exec, runChecked } from "../lib/exec.ts";
import type { SecretReader } from "../lib/kube/secrets.ts";
import type { CallOptions, SpdkRpc } from "../lib/spdk/client.ts";
import type { SpdkMethods } from "../lib/spdk/methods.ts";
import type { BlockDevices } from "./devices/block-devices.ts";

/** A SecretReader over `"namespace/name/key" -> value`; the map may change between calls. */
export function mapSecretReader(values: Map<string, string>): SecretReader {
  return { read: async (ns, name, key) => values.get(`${ns}/${name}/${key}`) };
}

/** One call a RecordingRpc passed through. */
export interface RecordedCall {
  readonly method: string;
  readonly params: unknown;
  readonly ok: boolean;
}

/** An SpdkRpc that records every call it forwards (params as sent), for assertions on exact JSON. */
export class RecordingRpc implements SpdkRpc {
  readonly calls: RecordedCall[] = [];
  constructor(private readonly inner: SpdkRpc) {}

  async call(method: string, params?: object, opts?: CallOptions): Promise<unknown> {
    try {
      const out = await this.inner.call(method, params, opts);
      this.calls.push({ method, params: structuredClone(params), ok: true });
      return out;
    } catch (err) {
      this.calls.push({ method, params: structuredClone(params), ok: false });
      throw err;
    }
  }

  serialize<T>(key: string, fn: () => Promise<T>): Promise<T> {
    return this.inner.serialize(key, fn);
  }

  /** The params of the calls of `method`, successful or not. */
  paramsOf(method: string): unknown[] {
    return this.calls.filter((c) => c.method === method).map((c) => c.params);
  }
}

/** A listener of a target subsystem, in SPDK's terms. */
export interface TargetListener {
  readonly trtype: "TCP" | "RDMA";
  readonly adrfam: "ipv4" | "ipv6";
  readonly traddr: string;
  readonly trsvcid: string;
}

/**
 * Exports `bdevName` as namespace 1 of subsystem `nqn` on a target, as DISTORT's agent does:
 * transport, subsystem (no host allowed by default), namespace, listeners, then the allowed
 * hosts with their DH-HMAC-CHAP key names. Idempotent for transports only; call once per subsystem.
 */
export async function exportOnTarget(
  m: SpdkMethods,
  o: {
    nqn: string;
    bdevName: string;
    listeners: readonly TargetListener[];
    hosts: readonly { nqn: string; dhchapKey?: string }[];
    serial?: string;
  },
): Promise<void> {
  for (const trtype of new Set(o.listeners.map((l) => l.trtype))) {
    await m.nvmfCreateTransport({ trtype }).catch((err) => {
      if (!(err instanceof StorageError && err.kind === "already-exists")) throw err;
    });
  }
  await m.nvmfCreateSubsystem({
    nqn: o.nqn,
    serial_number: o.serial ?? "DISTORT0001",
    allow_any_host: false,
  });
  await m.nvmfSubsystemAddNs({ nqn: o.nqn, namespace: { bdev_name: o.bdevName } });
  for (const l of o.listeners) await m.nvmfSubsystemAddListener({ nqn: o.nqn, listen_address: { ...l } });
  for (const h of o.hosts) {
    await m.nvmfSubsystemAddHost({
      nqn: o.nqn,
      host: h.nqn,
      ...(h.dhchapKey ? { dhchap_key: h.dhchapKey } : {}),
    });
  }
}

const SnapBdevSchema = v.array(
  v.looseObject({
    name: v.string(),
    driver_specific: v.optional(
      v.looseObject({
        nvme: v.optional(
          v.array(
            v.looseObject({
              trid: v.looseObject({ subnqn: v.optional(v.string()) }),
              ns_data: v.optional(v.looseObject({ id: v.number() })),
            }),
          ),
        ),
      }),
    ),
  }),
);
const SubsystemsSchema = v.array(
  v.looseObject({
    nqn: v.string(),
    namespaces: v.optional(v.array(v.looseObject({ nsid: v.number(), bdev_name: v.string() })), []),
  }),
);
const TargetBdevSchema = v.array(
  v.looseObject({
    name: v.string(),
    driver_specific: v.optional(v.looseObject({ aio: v.optional(v.looseObject({ filename: v.string() })) })),
  }),
);
const LosetupSchema = v.object({
  loopdevices: v.optional(
    v.array(v.looseObject({ name: v.string(), "back-file": v.nullable(v.string()) })),
    [],
  ),
});

/**
 * BlockDevices for tests and the lab, where SNAP has no NBD: the kernel device of a SNAP bdev is
 * a loop device over the file behind the target namespace the bdev reaches (an AIO bdev on the
 * target), found by asking SNAP (the bdev's subsystem and nsid) and the target (that namespace's
 * bdev and file), as an operator would. Both sides use the same file through the page cache, so
 * what the DPU kernel writes is what SNAP reads over the fabric. State lives in the kernel's loop
 * table, so a restarted plugin finds its devices again. A namespace that is not file-backed (an
 * lvol) is "unimplemented".
 */
export function loopBlockDevices(o: { exec: Exec; snap: SpdkRpc; target: SpdkRpc }): BlockDevices {
  const backingFile = async (bdev: string): Promise<string | undefined> => {
    let bdevs: v.InferOutput<typeof SnapBdevSchema>;
    try {
      bdevs = v.parse(SnapBdevSchema, await o.snap.call("bdev_get_bdevs", { name: bdev }));
    } catch (err) {
      if (err instanceof StorageError && err.kind === "not-found") return undefined;
      throw err;
    }
    const path = bdevs[0]?.driver_specific?.nvme?.[0];
    const subnqn = path?.trid.subnqn;
    if (!path || subnqn === undefined)
      throw new StorageError("unimplemented", `${bdev} is not an NVMe-oF bdev`);
    const nsid = path.ns_data?.id ?? 1;
    const subs = v.parse(SubsystemsSchema, await o.target.call("nvmf_get_subsystems", { nqn: subnqn }));
    const ns = subs[0]?.namespaces.find((n) => n.nsid === nsid);
    if (!ns) throw new StorageError("not-found", `target has no namespace ${nsid} in ${subnqn}`);
    const [tb] = v.parse(TargetBdevSchema, await o.target.call("bdev_get_bdevs", { name: ns.bdev_name }));
    const file = tb?.driver_specific?.aio?.filename;
    if (file === undefined) {
      throw new StorageError(
        "unimplemented",
        `target bdev ${ns.bdev_name} is not file-backed; a loop device cannot show it`,
      );
    }
    return file;
  };
  const loops = async () =>
    v.parse(LosetupSchema, JSON.parse((await runChecked(o.exec, ["losetup", "--list", "--json"])) || "{}"))
      .loopdevices;
  const loopOf = async (file: string) => (await loops()).find((l) => l["back-file"] === file)?.name;
  return {
    async list() {
      const out = new Map<string, string>();
      const all = v.parse(SnapBdevSchema, await o.snap.call("bdev_get_bdevs"));
      for (const b of all) {
        if (!b.driver_specific?.nvme) continue;
        const file = await backingFile(b.name).catch(() => undefined);
        const dev = file === undefined ? undefined : await loopOf(file);
        if (dev !== undefined) out.set(b.name, dev);
      }
      return out;
    },
    async export(bdev) {
      const file = await backingFile(bdev);
      if (file === undefined) throw new StorageError("not-found", `SNAP has no bdev ${bdev}`);
      const have = await loopOf(file);
      if (have !== undefined) return have;
      return (await runChecked(o.exec, ["losetup", "--find", "--show", file])).trim();
    },
    async unexport(bdev) {
      let file: string | undefined;
      try {
        file = await backingFile(bdev);
      } catch (err) {
        // A namespace no loop device can show was never exported.
        if (err instanceof StorageError && err.kind === "unimplemented") return;
        throw err;
      }
      if (file === undefined) return;
      for (const l of await loops()) {
        if (l["back-file"] === file) await runChecked(o.exec, ["losetup", "--detach", l.name]);
      }
    },
  };
}
