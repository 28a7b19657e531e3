// fileDeviceStore's record schema: a device record round-trips whole, and one with a field out of
// range is refused on write and reported on read. The store's durability and error rules are
// tested with JsonRecordStore in lib/.
import { afterAll, expect, test } from "bun:test";
import { mkdtemp, readdir, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { StorageError } from "../../lib/errors.ts";
import { type DeviceRecord, fileDeviceStore } from "./state-store.ts";

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

test("a device record round-trips whole", async () => {
  const s = fileDeviceStore(join(root, "a", "state"));
  const full = rec("weird/id with spaces", {
    phase: "ready",
    accessModes: [1, 3],
    volumeContext: { k: "v" },
  });
  await s.put(rec("v1"));
  await s.put(full);
  expect(await s.get("weird/id with spaces")).toEqual(full);
  expect(await s.get("v1")).toEqual(rec("v1"));
});

test("a malformed device record is refused on write and an internal error on read", async () => {
  const s = fileDeviceStore(join(root, "b"));
  expect(
    ((await s.put({ ...rec("v"), volumeMode: "Object" as "Block" }).catch((e: Error) => e)) as Error).message,
  ).toContain("malformed");
  await s.put(rec("v1"));
  const [file] = await readdir(join(root, "b"));
  await writeFile(join(root, "b", file as string), JSON.stringify({ ...rec("v1"), phase: "gone" }));
  const err = (await s.get("v1").catch((e: Error) => e)) as StorageError;
  expect(err).toBeInstanceOf(StorageError);
  expect(err.kind).toBe("internal");
  expect(err.message).toContain("malformed");
});
