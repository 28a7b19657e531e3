// Hugepages for SPDK's DPDK memory: what the host has reserved and mounted (sysfs, /proc), how
// much nvmf_tgt needs for its -s and the volumes the node will serve, and the check over both.
import type { HostFs } from "../fs.ts";
import type { CheckResult } from "./check.ts";

const MiB = 1024 * 1024;

/** One reserved page size: /sys/kernel/mm/hugepages/hugepages-<kB>kB. */
export interface HugepagePool {
  readonly pageBytes: number;
  readonly total: number;
  readonly free: number;
}

/** What the host shows; `mounted` is null when /proc/mounts could not be read. */
export interface HugepageFacts {
  readonly pools: readonly HugepagePool[];
  readonly mounted: boolean | null;
  /** Where the facts came from, for messages ("sysfs", "meminfo", or "none"). */
  readonly source: "sysfs" | "meminfo" | "none";
}

async function readInt(fs: HostFs, path: string): Promise<number | undefined> {
  try {
    const n = Number.parseInt((await fs.readFile(path)).trim(), 10);
    return Number.isFinite(n) ? n : undefined;
  } catch {
    return undefined;
  }
}

/**
 * Reads the reserved pools from sysfs (every page size), else HugePages_Total/Free and
 * Hugepagesize from /proc/meminfo, and whether a hugetlbfs is mounted. Never throws: what cannot
 * be read is an empty pool list (source "none") or mounted null.
 */
export async function readHugepages(fs: HostFs): Promise<HugepageFacts> {
  let pools: HugepagePool[] = [];
  let source: HugepageFacts["source"] = "none";
  try {
    for (const dir of (await fs.readdir("/sys/kernel/mm/hugepages")).sort()) {
      const m = /^hugepages-(\d+)kB$/.exec(dir);
      if (!m) continue;
      const base = `/sys/kernel/mm/hugepages/${dir}`;
      const total = await readInt(fs, `${base}/nr_hugepages`);
      if (total === undefined) continue;
      const free = (await readInt(fs, `${base}/free_hugepages`)) ?? 0;
      pools.push({ pageBytes: Number(m[1]) * 1024, total, free });
    }
    if (pools.length > 0) source = "sysfs";
  } catch {
    pools = [];
  }
  if (source === "none") {
    try {
      const text = await fs.readFile("/proc/meminfo");
      const field = (name: string) => {
        const m = new RegExp(`^${name}:\\s+(\\d+)`, "m").exec(text);
        return m ? Number(m[1]) : undefined;
      };
      const total = field("HugePages_Total");
      const sizeKb = field("Hugepagesize");
      if (total !== undefined && sizeKb !== undefined) {
        pools = [{ pageBytes: sizeKb * 1024, total, free: field("HugePages_Free") ?? 0 }];
        source = "meminfo";
      }
    } catch {
      // Neither source: reported as unknown by the check.
    }
  }
  let mounted: boolean | null = null;
  try {
    const mounts = await fs.readFile("/proc/mounts");
    mounted = mounts.split("\n").some((l) => l.split(" ")[2] === "hugetlbfs");
  } catch {
    mounted = null;
  }
  return { pools, mounted, source };
}

/**
 * DISTORT's estimate of nvmf_tgt's DPDK memory, from what the agent configures. The agent starts
 * nvmf_tgt with SPDK's default iobuf and bdev_io pools and creates each transport with SPDK's
 * defaults; every volume is one subsystem with one namespace and one allowed host.
 * - base: the iobuf pools (8192 small buffers of 8 KiB = 64 MiB, 1024 large of 132 KiB = 132 MiB),
 *   the bdev_io pool (65535 entries), the message pool and DPDK's own memzones, rounded up to 512
 *   MiB; this is also the floor the peers' field models start from.
 * - per volume: each connected host brings an admin queue and `ioQueuesPerHost` I/O queues; the TCP
 *   transport allocates per queue max_queue_depth (128) in-capsule buffers of 4 KiB and
 *   2 x 128 + 1 PDUs (about 1 KiB each) from hugepage memory: 9 queues x 769 KiB = 6.8 MiB at the
 *   default 8 I/O queues, rounded up per volume.
 */
export const HUGEPAGE_MODEL = {
  baseMiB: 512,
  queueDepth: 128,
  inCapsuleBytes: 4096,
  pduBytes: 1024,
  ioQueuesPerHost: 8,
} as const;

/** MiB of hugepage memory nvmf_tgt needs to serve `volumes` volumes (one host each). Pure. */
export function estimateHugepageMiB(
  volumes: number,
  ioQueuesPerHost: number = HUGEPAGE_MODEL.ioQueuesPerHost,
): number {
  const m = HUGEPAGE_MODEL;
  const perQueue = m.queueDepth * m.inCapsuleBytes + (2 * m.queueDepth + 1) * m.pduBytes;
  const perVolumeMiB = Math.ceil(((1 + ioQueuesPerHost) * perQueue) / MiB);
  return m.baseMiB + Math.max(0, volumes) * perVolumeMiB;
}

/** What nvmf_tgt on this node is configured to take and to serve. */
export interface HugepageNeed {
  /** nvmf_tgt -s in MiB (DISTORT_SPDK_MEM_SIZE_MB); undefined: no -s, DPDK takes what it needs. */
  readonly memSizeMiB?: number;
  /** Volumes the node is meant to serve (placed partitions, or the operator's plan). */
  readonly volumes: number;
}

/**
 * The hugepages check. fail: nothing reserved, no hugetlbfs mounted, or fewer reserved than nvmf_tgt
 * -s (DPDK refuses to start); warn: facts unreadable, fewer free than needed (fine only while an
 * nvmf_tgt already holds them), or -s below the estimate for the planned volumes. Pure.
 */
export function checkHugepages(facts: HugepageFacts, need: HugepageNeed): CheckResult {
  const id = "hugepages";
  const estimate = estimateHugepageMiB(need.volumes);
  const want = need.memSizeMiB ?? estimate;
  const totalMiB = Math.floor(facts.pools.reduce((s, p) => s + p.total * p.pageBytes, 0) / MiB);
  const freeMiB = Math.floor(facts.pools.reduce((s, p) => s + p.free * p.pageBytes, 0) / MiB);
  const sizes = facts.pools.map((p) => `${p.total} x ${formatPage(p.pageBytes)} (${p.free} free)`).join(", ");
  const details = {
    source: facts.source,
    pools: facts.pools,
    totalMiB,
    freeMiB,
    mounted: facts.mounted,
    memSizeMiB: need.memSizeMiB ?? null,
    volumes: need.volumes,
    estimateMiB: estimate,
  };
  const fix = `reserve at least ${want} MiB, e.g. echo ${Math.ceil(want / 2)} > /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages (or hugepages= on the kernel command line), and mount hugetlbfs`;
  if (facts.source === "none") {
    return {
      id,
      status: "warn",
      message: "cannot read hugepage counts (no /sys/kernel/mm/hugepages, no /proc/meminfo)",
      details,
    };
  }
  if (totalMiB === 0) {
    return { id, status: "fail", message: `no hugepages reserved; nvmf_tgt needs ${want} MiB`, fix, details };
  }
  if (facts.mounted === false) {
    return {
      id,
      status: "fail",
      message: `${sizes} reserved, but no hugetlbfs is mounted: DPDK cannot map them`,
      fix: "mount -t hugetlbfs nodev /dev/hugepages (a Pod gets one from a medium: HugePages volume)",
      details,
    };
  }
  const what = need.memSizeMiB === undefined ? `the estimate for ${need.volumes} volumes` : `nvmf_tgt -s`;
  if (totalMiB < want) {
    return {
      id,
      status: "fail",
      message: `${totalMiB} MiB reserved (${sizes}); ${what} needs ${want} MiB`,
      fix,
      details,
    };
  }
  if (need.memSizeMiB !== undefined && need.memSizeMiB < estimate) {
    return {
      id,
      status: "warn",
      message: `nvmf_tgt -s ${need.memSizeMiB} MiB is below DISTORT's estimate of ${estimate} MiB for ${need.volumes} volumes (512 MiB + about 7 MiB per volume)`,
      fix: `raise agent.spdk.hugepages.sizeMiB (DISTORT_SPDK_MEM_SIZE_MB) to ${estimate} and reserve as much`,
      details,
    };
  }
  if (freeMiB < want) {
    return {
      id,
      status: "warn",
      message: `${totalMiB} MiB reserved but only ${freeMiB} MiB free; ${what} needs ${want} MiB (fine if this node's nvmf_tgt already runs and holds them)`,
      details,
    };
  }
  const mountNote = facts.mounted === null ? "; hugetlbfs mounts unknown" : ", hugetlbfs mounted";
  return {
    id,
    status: "pass",
    message: `${totalMiB} MiB reserved (${sizes})${mountNote}; ${what} needs ${want} MiB`,
    details,
  };
}

function formatPage(bytes: number): string {
  return bytes >= 1024 * MiB ? `${bytes / (1024 * MiB)}G` : `${bytes / MiB}M`;
}
