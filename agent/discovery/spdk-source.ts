// SPDK-owned NVMe controllers: the raw replies of bdev_nvme_get_controllers and bdev_get_bdevs,
// parsed with valibot and joined on the controller's PCIe address. Only namespace ID 1 is taken,
// by its explicit NSID; a controller without it is a problem, never a guess.
import * as v from "valibot";
import { errorMessage } from "../../lib/errors.ts";
import { normalizePciAddress } from "../../lib/pci-address.ts";
import {
  formatSpdkVersion,
  MIN_SPDK_VERSION,
  parseSpdkVersion,
  spdkVersionSupported,
} from "../../lib/spdk/version.ts";
import type { InventoryProblem, SkippedController, SourceController, SourceScan } from "./inventory.ts";
import { checkSerial, isProblem, validateController } from "./validate-controller.ts";

/**
 * The SPDK calls discovery needs, as a port: each resolves with the `result` member of the reply
 * (unparsed) and rejects when the call fails. Implementations may be called concurrently.
 */
export interface SpdkInventorySource {
  /** bdev_nvme_get_controllers without params. */
  listControllers(): Promise<unknown>;
  /** bdev_get_bdevs without params. */
  getBdevs(): Promise<unknown>;
  /** spdk_get_version without params; when absent, the version is neither read nor checked. */
  getVersion?(): Promise<unknown>;
}

const TridSchema = v.looseObject({
  trtype: v.string(),
  traddr: v.string(),
});

const ControllerSchema = v.looseObject({
  name: v.pipe(v.string(), v.minLength(1)),
  ctrlrs: v.pipe(
    v.array(
      v.looseObject({
        state: v.optional(v.string()),
        trid: TridSchema,
        numa_id: v.optional(v.number()),
      }),
    ),
    v.minLength(1),
  ),
});

/** Just enough to tell an NVMe bdev from the others (lvol, malloc, aio...), which are ignored. */
const AnyBdevSchema = v.looseObject({
  name: v.string(),
  driver_specific: v.optional(v.looseObject({ nvme: v.optional(v.unknown()) })),
});

const NvmeBdevSchema = v.looseObject({
  name: v.pipe(v.string(), v.minLength(1)),
  block_size: v.pipe(v.number(), v.integer(), v.minValue(1)),
  num_blocks: v.pipe(v.number(), v.integer(), v.minValue(0)),
  numa_id: v.optional(v.number()),
  driver_specific: v.looseObject({
    nvme: v.pipe(
      v.array(
        v.looseObject({
          trid: TridSchema,
          ctrlr_data: v.looseObject({
            serial_number: v.string(),
            model_number: v.optional(v.string()),
          }),
          ns_data: v.looseObject({ id: v.pipe(v.number(), v.integer(), v.minValue(1)) }),
        }),
      ),
      v.minLength(1),
    ),
  }),
});
type NvmeBdev = v.InferOutput<typeof NvmeBdevSchema>;
type NvmePath = NvmeBdev["driver_specific"]["nvme"][number];

/** A namespace bdev together with its path through the controller being looked at. */
interface NamespaceBdev {
  readonly bdev: NvmeBdev;
  readonly path: NvmePath;
}

/** SPDK prints trtype as PCIe, TCP, RDMA...; compare case-insensitively. */
function isPcie(trtype: string): boolean {
  return trtype.toLowerCase() === "pcie";
}

function firstIssue(issues: readonly v.BaseIssue<unknown>[]): string {
  const i = issues[0];
  return i ? `${v.getDotPath(i) ?? "<root>"}: ${i.message}` : "invalid";
}

/** Thrown when a reply as a whole is unusable (not an array): the source failed. */
export class SpdkReplyError extends Error {}

/**
 * Joins the two replies into controllers of the SPDK source. Entries that fail their schema are
 * problems (the rest still count); non-PCIe controllers (attached remote subsystems) are not local
 * drives and are ignored; failed or disabled controllers are skipped as absent. Throws
 * SpdkReplyError when either reply is not an array. Pure.
 */
export function parseSpdkInventory(
  controllersReply: unknown,
  bdevsReply: unknown,
): Pick<SourceScan, "controllers" | "problems" | "skipped" | "found"> {
  if (!Array.isArray(controllersReply)) {
    throw new SpdkReplyError("bdev_nvme_get_controllers did not return an array");
  }
  if (!Array.isArray(bdevsReply)) throw new SpdkReplyError("bdev_get_bdevs did not return an array");
  const problems: InventoryProblem[] = [];
  const skipped: SkippedController[] = [];
  const problem = (
    controller: string,
    reason: string,
    message: string,
    known: { serial?: string; pciAddress?: string } = {},
  ) => problems.push({ source: "spdk", controller, reason, message, ...known });

  // Namespace bdevs by normalized PCIe address of (one of) their paths.
  const byAddress = new Map<string, NamespaceBdev[]>();
  for (const raw of bdevsReply) {
    const any = v.safeParse(AnyBdevSchema, raw);
    if (!any.success) {
      problem("", "BdevMalformed", `bdev entry: ${firstIssue(any.issues)}`);
      continue;
    }
    if (any.output.driver_specific?.nvme === undefined) continue;
    const b = v.safeParse(NvmeBdevSchema, raw);
    if (!b.success) {
      problem(any.output.name, "BdevMalformed", `bdev ${any.output.name}: ${firstIssue(b.issues)}`);
      continue;
    }
    for (const path of b.output.driver_specific.nvme) {
      if (!isPcie(path.trid.trtype)) continue;
      const addr = normalizePciAddress(path.trid.traddr);
      if (addr === undefined) continue;
      byAddress.set(addr, [...(byAddress.get(addr) ?? []), { bdev: b.output, path }]);
    }
  }

  const controllers: SourceController[] = [];
  let found = 0;
  for (const raw of controllersReply) {
    const c = v.safeParse(ControllerSchema, raw);
    if (!c.success) {
      const name = (raw as { name?: unknown })?.name;
      found++;
      problem(typeof name === "string" ? name : "", "ControllerMalformed", firstIssue(c.issues));
      continue;
    }
    const path = c.output.ctrlrs.find((p) => isPcie(p.trid.trtype));
    if (!path) continue; // an NVMe-oF controller: someone else's storage
    found++;
    const name = c.output.name;
    const pci = normalizePciAddress(path.trid.traddr);
    if (path.state === "deleting") {
      problem(
        name,
        "ControllerInTransition",
        `controller ${name} is being detached`,
        pci ? { pciAddress: pci } : {},
      );
      continue;
    }
    if (pci === undefined) {
      problem(name, "PciAddressInvalid", `PCIe traddr ${JSON.stringify(path.trid.traddr)} is not d:b:d.f`);
      continue;
    }
    const namespaces = byAddress.get(pci) ?? [];
    // The serial lives in the namespace bdevs; any namespace of the controller shows it.
    const anySerial = namespaces[0] ? checkSerial(namespaces[0].path.ctrlr_data.serial_number) : undefined;
    const serialOf = anySerial && "serial" in anySerial ? anySerial.serial : undefined;
    if (path.state === "failed" || path.state === "disabled") {
      skipped.push({
        source: "spdk",
        controller: name,
        reason: path.state === "failed" ? "ControllerFailed" : "ControllerDisabled",
        ...(serialOf === undefined ? {} : { serial: serialOf }),
      });
      continue;
    }
    const ns1 = namespaces.find((n) => n.path.ns_data.id === 1);
    if (!ns1) {
      const serial = serialOf === undefined ? "" : ` (serial ${serialOf})`;
      problem(
        name,
        "Namespace1Missing",
        namespaces.length === 0
          ? `controller ${name}${serial} at ${pci} exposes no namespace bdevs`
          : `controller ${name}${serial} at ${pci} has no namespace 1 (NSIDs ${namespaces.map((n) => n.path.ns_data.id).join(", ")})`,
        { pciAddress: pci, ...(serialOf === undefined ? {} : { serial: serialOf }) },
      );
      continue;
    }
    const data = ns1.path.ctrlr_data;
    const bytes = ns1.bdev.num_blocks * ns1.bdev.block_size;
    const r = validateController({
      source: "spdk",
      controller: name,
      serial: data.serial_number,
      pciAddress: path.trid.traddr,
      model: data.model_number,
      numaNode: ns1.bdev.numa_id ?? path.numa_id,
      namespace1Bytes: Number.isSafeInteger(bytes) ? bytes : Number.NaN,
      bdev: ns1.bdev.name,
    });
    if (isProblem(r)) problems.push(r);
    else controllers.push(r);
  }
  return { controllers, problems, skipped, found };
}

/**
 * Scans the SPDK source; never rejects. Without a source (a node that runs no SPDK) the answer is
 * complete and empty. A failed RPC or a reply that is not an array makes the source failed.
 */
export async function scanSpdk(source: SpdkInventorySource | undefined): Promise<SourceScan> {
  const empty = { source: "spdk" as const, found: 0, controllers: [], problems: [], skipped: [] };
  if (!source) return { ...empty, notConfigured: true };
  let version: string | undefined;
  if (source.getVersion) {
    let reply: unknown;
    try {
      reply = await source.getVersion();
    } catch (err) {
      return {
        ...empty,
        failure: { reason: "RpcFailed", message: `spdk_get_version failed: ${errorMessage(err)}` },
      };
    }
    const parsed = parseSpdkVersion(reply);
    if (!parsed)
      return {
        ...empty,
        failure: { reason: "ReplyMalformed", message: "spdk_get_version reply has no version fields" },
      };
    version = formatSpdkVersion(parsed);
    if (!spdkVersionSupported(parsed)) {
      return {
        ...empty,
        version,
        failure: {
          reason: "SpdkVersionUnsupported",
          message: `the target runs ${parsed.text}; this agent needs SPDK ${formatSpdkVersion(MIN_SPDK_VERSION)} or newer, so it advertises no SPDK drives until nvmf_tgt is upgraded`,
        },
      };
    }
  }
  const withVersion = version === undefined ? {} : { version };
  let replies: [unknown, unknown];
  try {
    replies = await Promise.all([source.listControllers(), source.getBdevs()]);
  } catch (err) {
    return {
      ...empty,
      ...withVersion,
      failure: { reason: "RpcFailed", message: `SPDK inventory RPC failed: ${errorMessage(err)}` },
    };
  }
  try {
    return { source: "spdk", ...withVersion, ...parseSpdkInventory(replies[0], replies[1]) };
  } catch (err) {
    if (err instanceof SpdkReplyError) {
      return { ...empty, ...withVersion, failure: { reason: "ReplyMalformed", message: err.message } };
    }
    throw err;
  }
}
