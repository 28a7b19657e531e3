// fileStateStore's record schema: a staged volume with every field survives a round trip (the
// schema drops nothing), and a record that is not a staged volume is refused. The store's
// durability and error rules are tested with JsonRecordStore in lib/.
import { afterAll, expect, test } from "bun:test";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileStateStore, type StagedVolume } from "./state-store.ts";

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

test("every field of a staged volume round-trips; the directory exists from construction", async () => {
  const store = fileStateStore(join(dir, "a"));
  expect(existsSync(join(dir, "a"))).toBe(true);
  const full = rec("ns/pvc-1/uid", {
    namespaceUUID: "6f1c0e4e-0000-4000-8000-000000000001",
    device: "/dev/nvme1n1",
    publications: [
      { targetPath: "/t", readonly: true },
      { targetPath: "/u", readonly: true, view: "/dev/loop3" },
    ],
  });
  await store.put(rec("ns/pvc-1/uid"));
  await store.put(full);
  await store.put(rec("../../etc/passwd", { access: { kind: "block" } }));
  expect(await store.get("ns/pvc-1/uid")).toEqual(full);
  expect(await store.get("../../etc/passwd")).toEqual(rec("../../etc/passwd", { access: { kind: "block" } }));
});

test("a record that is not a staged volume is refused", async () => {
  const store = fileStateStore(join(dir, "b"));
  const err = await store.put(rec("v", { stagingPath: "relative" })).catch((e) => e);
  expect(err.kind).toBe("internal");
  expect(await store.list()).toEqual([]);
});
