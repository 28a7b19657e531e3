// The pure side of the space report: lvstores and lvol bdevs of one statistics round, and when a
// thin partition counts as out of space (no free cluster, clusters of its own still unallocated).
import { expect, test } from "bun:test";
import type { NVMePartition } from "../../api/index.ts";
import type * as S from "../../lib/spdk/schemas.ts";
import { roundSpace, spaceExhausted } from "./space-report.ts";

const MiB = 1024 * 1024;
const UUID = "6a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d";
const store = (free: number): S.Lvstore => ({
  uuid: UUID,
  name: "lvs_SER1",
  base_bdev: "Nvme0n1",
  total_data_clusters: 10,
  free_clusters: free,
  block_size: 4096,
  cluster_size: 4 * MiB,
});
const lvol = (name: string, mib: number, allocated: number, thin = true) =>
  ({
    name,
    aliases: [`lvs_SER1/${name}-alias`],
    product_name: "Logical Volume",
    block_size: 4096,
    num_blocks: (mib * MiB) / 4096,
    driver_specific: {
      lvol: {
        lvol_store_uuid: UUID,
        base_bdev: "Nvme0n1",
        thin_provision: thin,
        num_allocated_clusters: allocated,
        snapshot: false,
        clone: false,
      },
    },
  }) as S.Bdev;
const part = (bdev: string) =>
  ({
    spec: { sizeBytes: 1, thinProvisioning: true },
    status: { backendPath: bdev },
  }) as unknown as NVMePartition;

test("lvstore space in bytes, lvols by name and alias", () => {
  const s = roundSpace([store(3)], [lvol("a", 40, 7)]);
  expect(s.lvstores.get("lvs_SER1")).toMatchObject({
    totalBytes: 40 * MiB,
    freeBytes: 12 * MiB,
    freeClusters: 3,
  });
  expect(s.lvols.get("a")).toEqual({ lvstoreUuid: UUID, thin: true, allocated: 7, clusters: 10 });
  expect(s.lvols.get("lvs_SER1/a-alias")).toBe(s.lvols.get("a"));
});

test("exhausted only with no free cluster and clusters of its own left to allocate", () => {
  const bdevs = [lvol("a", 40, 7), lvol("full", 8, 2)];
  expect(spaceExhausted(part("a"), roundSpace([store(0)], bdevs))).toMatchObject({
    exhausted: true,
    unallocated: 3,
  });
  expect(spaceExhausted(part("a"), roundSpace([store(1)], bdevs))?.exhausted).toBe(false);
  // Fully allocated: its writes need no new cluster.
  expect(spaceExhausted(part("full"), roundSpace([store(0)], bdevs))?.exhausted).toBe(false);
  // Not in the round (not created yet, or another target): no verdict.
  expect(spaceExhausted(part("gone"), roundSpace([store(0)], bdevs))).toBeUndefined();
});
