// Test fixtures: bdev_nvme_get_controllers and bdev_get_bdevs results for SPDK-owned PCIe drives,
// built from the shape of the replies recorded from SPDK v25.05.1 (testdata/spdk-v25.05.1.jsonl),
// plus access to those recorded replies themselves (NVMe/TCP controllers of an initiator app).
import { readFileSync } from "node:fs";
import { join } from "node:path";

const RECORDS = join(import.meta.dir, "../../../testdata/spdk-v25.05.1.jsonl");

interface Recorded {
  seq: number;
  method: string;
  response: { result?: unknown; error?: unknown };
}

/** The `result` of the recorded reply with sequence number `seq` (must be a success reply). */
export function recordedResult(seq: number): unknown {
  for (const line of readFileSync(RECORDS, "utf8").split("\n")) {
    if (!line.trim()) continue;
    const r = JSON.parse(line) as Recorded;
    if (r.seq === seq) {
      if (!("result" in r.response)) throw new Error(`record ${seq} is an error reply`);
      return structuredClone(r.response.result);
    }
  }
  throw new Error(`no record ${seq}`);
}

/** Recorded: bdev_nvme_get_controllers with one NVMe/TCP controller Nvme0 (seq 90). */
export const RECORDED_TCP_CONTROLLERS = 90;
/** Recorded: bdev_get_bdevs of the remote namespace Nvme0n1 (seq 92) and Nvme0n2 (seq 93). */
export const RECORDED_TCP_BDEV_NS1 = 92;
export const RECORDED_TCP_BDEV_NS2 = 93;

export interface SpdkDrive {
  /** bdev_nvme controller name, e.g. Nvme0. */
  readonly name: string;
  /** traddr as SPDK prints it (0000:3b:00.0). */
  readonly pciAddress: string;
  /** As the drive reports it; SPDK prints it trimmed. */
  readonly serial: string;
  readonly model: string;
  readonly namespaces: readonly {
    readonly nsid: number;
    readonly blockSize: number;
    readonly numBlocks: number;
  }[];
  /** Controller state; default enabled. */
  readonly state?: string;
  readonly numaId?: number;
}

export function spdkControllers(drives: readonly SpdkDrive[]): unknown[] {
  return drives.map((d) => ({
    name: d.name,
    ctrlrs: [
      {
        state: d.state ?? "enabled",
        trid: { trtype: "PCIe", traddr: d.pciAddress },
        cntlid: 6,
        host: {
          nqn: "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555",
          addr: "",
          svcid: "",
        },
      },
    ],
  }));
}

/** The NVMe bdevs of `drives` (one per namespace) after `others` (non-NVMe bdevs such as lvols). */
export function spdkBdevs(drives: readonly SpdkDrive[], others: readonly unknown[] = []): unknown[] {
  // Start from a recorded NVMe bdev so every field SPDK prints is there.
  const template = (recordedResult(RECORDED_TCP_BDEV_NS1) as unknown[])[0];
  const out: unknown[] = [...others];
  for (const d of drives) {
    for (const ns of d.namespaces) {
      // biome-ignore lint/suspicious/noExplicitAny: a recorded reply being reshaped field by field
      const b = structuredClone(template) as any;
      const uuid = `a2b9eca3-73d0-4826-92fc-${(d.name.length * 1000 + ns.nsid).toString(16).padStart(12, "0")}`;
      b.name = `${d.name}n${ns.nsid}`;
      b.aliases = [uuid];
      b.uuid = uuid;
      b.block_size = ns.blockSize;
      b.num_blocks = ns.numBlocks;
      b.numa_id = d.numaId ?? -1;
      const path = b.driver_specific.nvme[0];
      b.driver_specific.nvme = [
        {
          pci_address: d.pciAddress,
          trid: { trtype: "PCIe", traddr: d.pciAddress },
          ctrlr_data: {
            ...path.ctrlr_data,
            vendor_id: "0x144d",
            model_number: d.model,
            serial_number: d.serial,
            firmware_revision: "GDC5902Q",
            subnqn: `nqn.1994-11.com.samsung:nvme:PM1733:2.5-inch:${d.serial}`,
            multi_ctrlr: false,
          },
          vs: path.vs,
          ns_data: { id: ns.nsid, can_share: false },
        },
      ];
      out.push(b);
    }
  }
  return out;
}

/** An lvol bdev as v25.05.1 prints it: not an NVMe bdev, so discovery must ignore it. */
export function lvolBdev(): unknown {
  return {
    name: "9c3e6a2e-1f3b-4f7e-9d2a-0c4b5e6f7a8b",
    aliases: ["lvs0/vol-1"],
    product_name: "Logical Volume",
    block_size: 4096,
    num_blocks: 262144,
    uuid: "9c3e6a2e-1f3b-4f7e-9d2a-0c4b5e6f7a8b",
    claimed: false,
    zoned: false,
    driver_specific: {
      lvol: {
        lvol_store_uuid: "3f1d1b0e-0000-4000-8000-000000000001",
        base_bdev: "Nvme0n1",
        thin_provision: false,
        num_allocated_clusters: 256,
        snapshot: false,
        clone: false,
        esnap_clone: false,
      },
    },
  };
}
