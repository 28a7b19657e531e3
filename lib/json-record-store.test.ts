// JsonRecordStore on a real temporary directory: round trip, atomic replace, keys with any
// characters, private files, leftover temporaries, corrupt and malformed records, unusable dirs.
import { afterAll, expect, test } from "bun:test";
import { chmod, mkdtemp, readdir, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as v from "valibot";
import { StorageError } from "./errors.ts";
import { JsonRecordStore, type RecordKind } from "./json-record-store.ts";

const root = await mkdtemp(join(tmpdir(), "record-store-"));
afterAll(() => rm(root, { recursive: true, force: true }));

const Schema = v.object({
  id: v.pipe(v.string(), v.minLength(1)),
  phase: v.picklist(["creating", "ready"]),
  tags: v.array(v.string()),
});
type Rec = v.InferOutput<typeof Schema>;
const KIND: RecordKind<Rec> = { schema: Schema, key: (r) => r.id, what: "test record" };
const rec = (id: string, over: Partial<Rec> = {}): Rec => ({ id, phase: "creating", tags: [], ...over });
const store = (dir: string) => new JsonRecordStore(join(root, dir), KIND);
const failure = (p: Promise<unknown>) =>
  p.then(
    () => undefined,
    (e: unknown) => e,
  );

test("put, get, replace, list, delete; the directory and files are private; names are hashes", async () => {
  const s = store("a/state");
  expect(await s.get("v1")).toBeUndefined();
  expect(await s.list()).toEqual([]);
  await s.put(rec("v1"));
  expect(((await stat(join(root, "a", "state"))).mode & 0o777).toString(8)).toBe("700");
  await s.put(rec("v1", { phase: "ready", tags: ["x"] }));
  await s.put(rec("../../etc/passwd"));
  await s.put(rec("weird/id with spaces"));
  expect(await s.get("v1")).toEqual(rec("v1", { phase: "ready", tags: ["x"] }));
  expect((await s.list()).map((r) => r.id).sort()).toEqual([
    "../../etc/passwd",
    "v1",
    "weird/id with spaces",
  ]);
  // No key reaches the file system as a path.
  const files = await readdir(join(root, "a", "state"));
  expect(files.length).toBe(3);
  expect(files.every((f) => /^[0-9a-f]{64}\.json$/.test(f))).toBe(true);
  expect(((await stat(join(root, "a", "state", files[0] as string))).mode & 0o777).toString(8)).toBe("600");
  await s.delete("v1");
  await s.delete("v1");
  expect(await s.get("v1")).toBeUndefined();
  expect((await s.list()).length).toBe(2);
  await s.check();
});

test("a leftover temporary file is ignored; a corrupt record is an internal error, not absence", async () => {
  const s = store("b");
  await s.put(rec("v1"));
  const [file] = await readdir(join(root, "b"));
  await writeFile(join(root, "b", `${file}.tmp`), "{half");
  expect((await s.list()).length).toBe(1);
  await writeFile(join(root, "b", file as string), "{half");
  for (const p of [s.get("v1"), s.list()]) {
    const err = await failure(p);
    expect(err).toBeInstanceOf(StorageError);
    expect((err as StorageError).kind).toBe("internal");
    expect((err as Error).message).toContain("not JSON");
  }
  await writeFile(join(root, "b", file as string), JSON.stringify({ ...rec("v1"), phase: "gone" }));
  const err = (await failure(s.get("v1"))) as StorageError;
  expect(err.kind).toBe("internal");
  expect(err.message).toContain("malformed: phase");
});

test("a record filed under another key's name is an error", async () => {
  const s = store("c");
  await s.put(rec("v1"));
  await s.put(rec("v2"));
  const files = await readdir(join(root, "c"));
  const one = (await s.get("v1")) as Rec;
  for (const f of files) await writeFile(join(root, "c", f), JSON.stringify(one));
  expect(((await failure(s.get("v2"))) as StorageError).message).toContain("belongs to another key");
});

test("refuses to save a malformed record; check() and put() fail on an unusable directory", async () => {
  const s = store("d");
  const bad = (await failure(s.put({ ...rec("v"), phase: "Object" as "ready" }))) as StorageError;
  expect(bad.kind).toBe("internal");
  expect(bad.message).toContain("malformed");
  expect(await s.list()).toEqual([]);
  await writeFile(join(root, "file"), "x");
  const unusable = new JsonRecordStore(join(root, "file", "state"), KIND);
  expect(((await failure(unusable.check())) as StorageError).kind).toBe("internal");
  const w = (await failure(unusable.put(rec("v")))) as StorageError;
  expect(w).toBeInstanceOf(StorageError);
  expect(w.kind).toBe("internal");
  await chmod(join(root, "file"), 0o600);
});
