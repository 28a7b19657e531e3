import { afterEach, expect, test } from "bun:test";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { hostFs } from "../fs.ts";
import { checkHugepages, estimateHugepageMiB, readHugepages } from "./hugepages.ts";

const roots: string[] = [];
afterEach(() => {
  for (const r of roots.splice(0)) rmSync(r, { recursive: true, force: true });
});

function tree(files: Record<string, string>): string {
  const root = mkdtempSync(join(tmpdir(), "preflight-huge-"));
  roots.push(root);
  for (const [p, text] of Object.entries(files)) {
    mkdirSync(dirname(join(root, p)), { recursive: true });
    writeFileSync(join(root, p), text);
  }
  return root;
}

const MOUNTS = "sysfs /sys sysfs rw 0 0\nhugetlbfs /dev/hugepages hugetlbfs rw,pagesize=2M 0 0\n";

test("the estimate is 512 MiB plus 7 MiB per volume at 8 I/O queues per host", () => {
  expect(estimateHugepageMiB(0)).toBe(512);
  expect(estimateHugepageMiB(10)).toBe(582);
  expect(estimateHugepageMiB(100)).toBe(1212);
  // One I/O queue: 2 queues x 769 KiB rounds up to 2 MiB.
  expect(estimateHugepageMiB(1, 1)).toBe(514);
});

test("reads every page size from sysfs and the hugetlbfs mount", async () => {
  const root = tree({
    "sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages": "1024\n",
    "sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages": "1000\n",
    "sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages": "2\n",
    "sys/kernel/mm/hugepages/hugepages-1048576kB/free_hugepages": "2\n",
    "proc/mounts": MOUNTS,
  });
  const facts = await readHugepages(hostFs(root));
  expect(facts.source).toBe("sysfs");
  expect(facts.mounted).toBe(true);
  expect(facts.pools).toEqual([
    { pageBytes: 1024 ** 3, total: 2, free: 2 },
    { pageBytes: 2 * 1024 ** 2, total: 1024, free: 1000 },
  ]);
  const r = checkHugepages(facts, { memSizeMiB: 2048, volumes: 10 });
  expect(r.status).toBe("pass");
  expect(r.message).toContain("4096 MiB reserved");
});

test("falls back to /proc/meminfo and fails below nvmf_tgt -s", async () => {
  const root = tree({
    "proc/meminfo":
      "MemTotal: 1 kB\nHugePages_Total:     256\nHugePages_Free:      256\nHugepagesize:       2048 kB\n",
    "proc/mounts": MOUNTS,
  });
  const facts = await readHugepages(hostFs(root));
  expect(facts.source).toBe("meminfo");
  const r = checkHugepages(facts, { memSizeMiB: 2048, volumes: 0 });
  expect(r.status).toBe("fail");
  expect(r.message).toBe("512 MiB reserved (256 x 2M (256 free)); nvmf_tgt -s needs 2048 MiB");
  expect(r.fix).toContain("1024 > /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages");
});

test("none reserved, not mounted, -s below the estimate, too few free, unreadable", () => {
  const pools = (total: number, free = total) => [{ pageBytes: 2 * 1024 ** 2, total, free }];
  expect(checkHugepages({ pools: pools(0), mounted: true, source: "sysfs" }, { volumes: 0 })).toMatchObject({
    status: "fail",
    message: "no hugepages reserved; nvmf_tgt needs 512 MiB",
  });
  expect(checkHugepages({ pools: pools(1024), mounted: false, source: "sysfs" }, { volumes: 0 }).status).toBe(
    "fail",
  );
  const low = checkHugepages(
    { pools: pools(1024), mounted: true, source: "sysfs" },
    { memSizeMiB: 1024, volumes: 100 },
  );
  expect(low.status).toBe("warn");
  expect(low.message).toContain("below DISTORT's estimate of 1212 MiB for 100 volumes");
  const busy = checkHugepages(
    { pools: pools(1024, 10), mounted: true, source: "sysfs" },
    { memSizeMiB: 1024, volumes: 0 },
  );
  expect(busy.status).toBe("warn");
  expect(busy.message).toContain("only 20 MiB free");
  // No -s: the estimate for the planned volumes is what must be reserved.
  expect(checkHugepages({ pools: pools(200), mounted: true, source: "sysfs" }, { volumes: 0 }).status).toBe(
    "fail",
  );
  expect(checkHugepages({ pools: [], mounted: null, source: "none" }, { volumes: 0 }).status).toBe("warn");
});
