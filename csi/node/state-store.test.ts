// FileStateStore: round trip, atomic replace, IDs with any characters, corrupt records surface.
import { afterAll, expect, test } from "bun:test";
import { mkdtempSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { FileStateStore, type StagedVolume } from "./state-store.ts";

const dir = mkdtempSync(join(tmpdir(), "node-state-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const rec = (volumeId: string, over: Partial<StagedVolume> = {}): StagedVolume => ({
  volumeId,
  stagingPath: "/var/lib/kubelet/plugins/x/globalmount",
  nqn: "nqn.2026-01.io.distort:vol-1",
  access: { kind: "mount", fsType: "xfs", mountFlags: ["noatime"] },
  mode: "SINGLE_NODE_WRITER",
  publications: [],
  ...over,
});

test("round trip, replace, list, delete", async () => {
  const store = new FileStateStore(join(dir, "a"));
  expect(await store.get("ns/pvc-1/uid")).toBeUndefined();
  await store.put(rec("ns/pvc-1/uid"));
  await store.put(
    rec("ns/pvc-1/uid", { device: "/dev/nvme1n1", publications: [{ targetPath: "/t", readonly: true }] }),
  );
  await store.put(rec("../../etc/passwd", { access: { kind: "block" } }));
  expect(await store.get("ns/pvc-1/uid")).toEqual(
    rec("ns/pvc-1/uid", { device: "/dev/nvme1n1", publications: [{ targetPath: "/t", readonly: true }] }),
  );
  expect((await store.list()).map((r) => r.volumeId).sort()).toEqual(["../../etc/passwd", "ns/pvc-1/uid"]);
  // Names are hashes: no ID reaches the file system as a path.
  expect(readdirSync(join(dir, "a")).every((n) => /^[0-9a-f]{64}\.json$/.test(n))).toBe(true);
  await store.delete("ns/pvc-1/uid");
  await store.delete("ns/pvc-1/uid");
  expect(await store.get("ns/pvc-1/uid")).toBeUndefined();
});

test("a corrupt record is an error, not an absent volume", async () => {
  const store = new FileStateStore(join(dir, "b"));
  await store.put(rec("v"));
  const [name] = readdirSync(join(dir, "b"));
  writeFileSync(join(dir, "b", name as string), "{");
  expect((await store.get("v").catch((e) => e)).kind).toBe("internal");
});
