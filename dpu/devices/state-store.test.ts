// Device records on a real temporary directory: atomic replace, listing, absent and corrupt files.
import { afterAll, expect, test } from "bun:test";
import { chmod, mkdtemp, readdir, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { StorageError } from "../../lib/errors.ts";
import { type DeviceRecord, FileDeviceStore } from "./state-store.ts";

const root = await mkdtemp(join(tmpdir(), "dpu-store-"));
afterAll(() => rm(root, { recursive: true, force: true }));

const rec = (volumeId: string, over: Partial<DeviceRecord> = {}): DeviceRecord => ({
  version: 1,
  volumeId,
  deviceName: "distort_x n1",
  phase: "creating",
  accessModes: [1],
  volumeMode: "Block",
  nqn: "nqn.2026-02.io.distort:pv-1",
  publishContext: { a: "b" },
  volumeContext: {},
  storageParameters: { policy: "p" },
  createdAt: "2026-01-01T00:00:00.000Z",
  updatedAt: "2026-01-01T00:00:00.000Z",
  ...over,
});

test("put, get, replace, list, delete; the directory is created private", async () => {
  const s = new FileDeviceStore(join(root, "a", "state"));
  expect(await s.get("v1")).toBeUndefined();
  expect(await s.list()).toEqual([]);
  await s.put(rec("v1"));
  expect(((await stat(join(root, "a", "state"))).mode & 0o777).toString(8)).toBe("700");
  await s.put(rec("v1", { phase: "ready" }));
  await s.put(rec("weird/id with spaces"));
  expect((await s.get("v1"))?.phase).toBe("ready");
  expect((await s.list()).map((r) => r.volumeId).sort()).toEqual(["v1", "weird/id with spaces"]);
  const files = await readdir(join(root, "a", "state"));
  expect(files.every((f) => /^[0-9a-f]{64}\.json$/.test(f))).toBe(true);
  expect(((await stat(join(root, "a", "state", files[0] as string))).mode & 0o777).toString(8)).toBe("600");
  await s.delete("v1");
  await s.delete("v1");
  expect(await s.get("v1")).toBeUndefined();
  await s.check();
});

test("a leftover temporary file is ignored; a corrupt record is an internal error, not absence", async () => {
  const dir = join(root, "b");
  const s = new FileDeviceStore(dir);
  await s.put(rec("v1"));
  const [file] = await readdir(dir);
  await writeFile(join(dir, `${file}.tmp`), "{half");
  expect((await s.list()).length).toBe(1);
  await writeFile(join(dir, file as string), "{half");
  for (const p of [s.get("v1"), s.list()]) {
    const err = await p.then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(StorageError);
    expect((err as StorageError).kind).toBe("internal");
  }
  await writeFile(join(dir, file as string), JSON.stringify({ ...rec("v1"), phase: "gone" }));
  expect(((await s.get("v1").catch((e: Error) => e)) as Error).message).toContain("malformed");
});

test("refuses to save a malformed record; check() fails on an unusable directory", async () => {
  const s = new FileDeviceStore(join(root, "c"));
  expect(
    ((await s.put({ ...rec("v"), volumeMode: "Object" as "Block" }).catch((e: Error) => e)) as Error).message,
  ).toContain("malformed");
  await writeFile(join(root, "file"), "x");
  const bad = new FileDeviceStore(join(root, "file", "state"));
  expect(((await bad.check().catch((e: StorageError) => e)) as StorageError).kind).toBe("internal");
  await chmod(join(root, "file"), 0o600);
});
