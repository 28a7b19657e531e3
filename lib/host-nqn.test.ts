// The node's host NQN file: trimmed, validated, and a clear error when missing or malformed.
import { afterAll, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { hostFs } from "./fs.ts";
import { readHostNqn } from "./host-nqn.ts";

const root = mkdtempSync(join(tmpdir(), "hostnqn-"));
const fs = hostFs(root);
afterAll(() => rmSync(root, { recursive: true, force: true }));

test("reads and trims a valid NQN", async () => {
  await fs.mkdir("/etc");
  await fs.mkdir("/etc/nvme");
  await fs.writeFile(
    "/etc/nvme/hostnqn",
    "nqn.2014-08.org.nvmexpress:uuid:cb39fbf1-e515-48f8-830b-34f0b60eceb0\n",
  );
  expect(await readHostNqn(fs)).toBe("nqn.2014-08.org.nvmexpress:uuid:cb39fbf1-e515-48f8-830b-34f0b60eceb0");
});

test("missing file is a precondition failure, garbage is invalid", async () => {
  expect((await readHostNqn(fs, "/etc/nvme/none").catch((e) => e)).kind).toBe("precondition");
  await fs.writeFile("/etc/nvme/bad", "nqn.2014-08.org.nvmexpress:uuid:not-a-uuid\n");
  expect((await readHostNqn(fs, "/etc/nvme/bad").catch((e) => e)).kind).toBe("invalid");
});
