// Guards the committed gen/: regenerates from proto/ into a scratch directory and fails on any
// byte difference, naming each file that is missing, extra or changed.

import { afterAll, expect, test } from "bun:test";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { genProto, listFiles, REPO_ROOT } from "./gen-proto";

const scratch = await mkdtemp(join(tmpdir(), "distort-gen-proto-test-"));
afterAll(() => rm(scratch, { recursive: true, force: true }));

test("committed gen/ matches a fresh buf generate (run `bun scripts/gen-proto.ts` to update)", async () => {
  const fresh = join(scratch, "gen");
  await genProto(fresh);
  const committed = join(REPO_ROOT, "gen");
  const want = await listFiles(fresh);
  const have = await listFiles(committed).catch(() => [] as string[]);
  const problems: string[] = [];
  for (const f of want) if (!have.includes(f)) problems.push(`missing: gen/${f}`);
  for (const f of have) if (!want.includes(f)) problems.push(`not generated (remove it): gen/${f}`);
  for (const f of want.filter((f) => have.includes(f))) {
    const [a, b] = await Promise.all([readFile(join(fresh, f)), readFile(join(committed, f))]);
    if (!a.equals(b)) problems.push(`differs: gen/${f}`);
  }
  expect(problems).toEqual([]);
}, 60_000);
