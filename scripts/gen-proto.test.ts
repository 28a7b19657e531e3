// Guards the committed gen/: regenerates from proto/ and fails on any byte difference, naming
// each file that is missing, extra or changed.
//
// Generation (buf, then protoc-gen-es under bun) costs ~1.5 s of CPU, so its output is kept in
// the cache under a key over everything it depends on: proto/, buf's configuration, this script's
// barrel code and the installed versions of buf, bun and the plugin's packages. The same key means
// the same bytes (generation is deterministic), so the comparison below is the one a fresh run
// would make; any change to an input regenerates. DISTORT_CACHE relocates the cache as for tools.

import { expect, test } from "bun:test";
import { createHash, randomUUID } from "node:crypto";
import { existsSync } from "node:fs";
import { mkdir, readFile, rename, rm } from "node:fs/promises";
import { homedir } from "node:os";
import { join } from "node:path";
import { genProto, listFiles, REPO_ROOT } from "./gen-proto";

/** Packages whose installed version shapes the generated code: buf, the plugin and what it loads, bun. */
const TOOL_PACKAGES = [
  "@bufbuild/buf",
  "@bufbuild/protoc-gen-es",
  "@bufbuild/protoplugin",
  "@bufbuild/protobuf",
  "typescript",
  "bun",
];

async function inputsKey(): Promise<string> {
  const files = [
    ...(await listFiles(join(REPO_ROOT, "proto"))).map((f) => `proto/${f}`),
    "buf.yaml",
    "buf.lock",
    "buf.gen.yaml",
    "scripts/gen-proto.ts",
    ...TOOL_PACKAGES.map((p) => `node_modules/${p}/package.json`),
  ];
  const h = createHash("sha256");
  for (const f of files) {
    const body = await readFile(join(REPO_ROOT, f)).catch(() => Buffer.from("<absent>"));
    h.update(`${f}\0${createHash("sha256").update(body).digest("hex")}\n`);
  }
  return h.digest("hex");
}

/** gen/ as scripts/gen-proto.ts would write it now: from the cache, else generated into it. */
async function freshGen(): Promise<string> {
  const root = join(process.env.DISTORT_CACHE ?? join(homedir(), ".cache", "distort"), "gen-proto");
  const cached = join(root, await inputsKey());
  if (existsSync(cached)) return cached;
  // Published by rename, so no reader sees a half-written entry.
  await mkdir(root, { recursive: true });
  const staged = join(root, `.staging-${process.pid}-${randomUUID()}`);
  try {
    await genProto(staged);
    await rename(staged, cached);
  } catch (err) {
    // A concurrent run published the same key first: its bytes are the same.
    if (!existsSync(cached)) throw err;
  } finally {
    await rm(staged, { recursive: true, force: true });
  }
  return cached;
}

test("committed gen/ matches a fresh buf generate (run `bun scripts/gen-proto.ts` to update)", async () => {
  const fresh = await freshGen();
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
