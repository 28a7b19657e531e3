// The staging sweep's rules: a volume is unstaged only when the Node's status has it neither
// attached nor in use on two sweeps in a row; a call holding it, an unreadable Node, a claim that
// comes back or a restage elsewhere each hold it off; a refusal is one report, not one per sweep.
import { beforeEach, expect, test } from "bun:test";
import { StorageError } from "../../lib/errors.ts";
import { silentLogger } from "../../lib/log.ts";
import { type NodeClaims, StagingSweep } from "./staging-sweep.ts";
import type { StagedVolume } from "./state-store.ts";
import { CallLog, MemoryStateStore } from "./test-doubles.ts";

const A = "distort-system/pvc-a/0b7c9a52-3c1d-4e5f-8a9b-0c1d2e3f4a5b";
const B = "distort-system/pvc-b/1c8d0b63-4d2e-4f60-9bac-1d2e3f4a5b6c";
const stagingOf = (id: string, n = 1) =>
  `/var/lib/kubelet/plugins/kubernetes.io/csi/storage.distort.io/${id.length}${n}/globalmount`;

function record(volumeId: string, stagingPath = stagingOf(volumeId)): StagedVolume {
  return {
    volumeId,
    stagingPath,
    nqn: `nqn.2026-02.io.distort:volume-${volumeId.slice(-6)}`,
    access: { kind: "mount", fsType: "ext4", mountFlags: [] },
    mode: "SINGLE_NODE_WRITER",
    device: "/dev/nvme1n1",
    publications: [],
  };
}

let state: MemoryStateStore;
let claims: NodeClaims | Error;
let unstaged: [string, string][];
let unstageFails: Map<string, Error>;
let reports: [string, string, string][];
let sweep: StagingSweep;

beforeEach(() => {
  state = new MemoryStateStore(new CallLog());
  claims = { attached: new Set(), inUse: new Set() };
  unstaged = [];
  unstageFails = new Map();
  reports = [];
  sweep = new StagingSweep({
    state,
    claims: async () => {
      if (claims instanceof Error) throw claims;
      return claims;
    },
    unstage: async (volumeId, stagingPath) => {
      const err = unstageFails.get(volumeId);
      if (err) throw err;
      unstaged.push([volumeId, stagingPath]);
      await state.delete(volumeId);
    },
    report: async (outcome, volumeId, stagingPath) => {
      reports.push([outcome, volumeId, stagingPath]);
    },
    logger: silentLogger,
  });
});

test("a volume the Node has attached or in use is never unstaged", async () => {
  await state.put(record(A));
  await state.put(record(B));
  claims = { attached: new Set([A]), inUse: new Set([B]) };
  for (let i = 0; i < 5; i++) {
    const r = await sweep.sweep();
    expect(r).toEqual({ unstaged: [], suspected: [], refused: [], busy: [] });
  }
  expect(unstaged).toEqual([]);
  expect((await state.list()).map((r) => r.volumeId).sort()).toEqual([A, B].sort());
});

test("a volume neither attached nor in use is suspected first and unstaged on the next sweep, with one report", async () => {
  await state.put(record(A));
  await state.put(record(B));
  claims = { attached: new Set([B]), inUse: new Set([B]) };
  expect(await sweep.sweep()).toEqual({ unstaged: [], suspected: [A], refused: [], busy: [] });
  expect(unstaged).toEqual([]);
  expect(await sweep.sweep()).toEqual({ unstaged: [A], suspected: [], refused: [], busy: [] });
  expect(unstaged).toEqual([[A, stagingOf(A)]]);
  expect(reports).toEqual([["unstaged", A, stagingOf(A)]]);
  expect((await state.list()).map((r) => r.volumeId)).toEqual([B]);
  expect(await sweep.sweep()).toEqual({ unstaged: [], suspected: [], refused: [], busy: [] });
});

test("a claim that returns between two sweeps clears the suspicion: the grace starts again", async () => {
  await state.put(record(A));
  expect((await sweep.sweep()).suspected).toEqual([A]);
  claims = { attached: new Set([A]), inUse: new Set() };
  expect(await sweep.sweep()).toEqual({ unstaged: [], suspected: [], refused: [], busy: [] });
  claims = { attached: new Set(), inUse: new Set() };
  expect((await sweep.sweep()).suspected).toEqual([A]);
  expect(unstaged).toEqual([]);
  expect((await sweep.sweep()).unstaged).toEqual([A]);
});

test("a volume staged again at another path between two sweeps gets its grace again", async () => {
  await state.put(record(A, stagingOf(A, 1)));
  expect((await sweep.sweep()).suspected).toEqual([A]);
  await state.put(record(A, stagingOf(A, 2)));
  expect((await sweep.sweep()).suspected).toEqual([A]);
  expect(unstaged).toEqual([]);
  expect((await sweep.sweep()).unstaged).toEqual([A]);
  expect(unstaged).toEqual([[A, stagingOf(A, 2)]]);
});

test("a Node that cannot be read makes the sweep do nothing, and keeps what the sweep before suspected", async () => {
  await state.put(record(A));
  claims = new StorageError("unavailable", "apiserver down");
  expect(await sweep.sweep()).toEqual({ unstaged: [], suspected: [], refused: [], busy: [] });
  expect(await sweep.sweep()).toEqual({ unstaged: [], suspected: [], refused: [], busy: [] });
  expect(unstaged).toEqual([]);
  claims = { attached: new Set(), inUse: new Set() };
  expect((await sweep.sweep()).suspected).toEqual([A]);
  claims = new StorageError("unavailable", "apiserver down again");
  expect((await sweep.sweep()).unstaged).toEqual([]);
  claims = { attached: new Set(), inUse: new Set() };
  expect((await sweep.sweep()).unstaged).toEqual([A]);
});

test("a CSI call holding the volume makes the sweep skip it and try again next time", async () => {
  await state.put(record(A));
  await sweep.sweep();
  unstageFails.set(A, new StorageError("busy", "NodeStageVolume in progress"));
  expect(await sweep.sweep()).toEqual({ unstaged: [], suspected: [], refused: [], busy: [A] });
  expect(reports).toEqual([]);
  unstageFails.clear();
  expect((await sweep.sweep()).unstaged).toEqual([A]);
});

test("an unstage that is refused (still published) is reported once, tried each sweep, and left as it is", async () => {
  await state.put(record(A));
  await sweep.sweep();
  unstageFails.set(A, new StorageError("precondition", `volume ${A} is still published at /pods/x`));
  for (let i = 0; i < 3; i++) {
    const r = await sweep.sweep();
    expect(r.refused).toEqual([{ volumeId: A, reason: `volume ${A} is still published at /pods/x` }]);
    expect(r.unstaged).toEqual([]);
  }
  expect(reports).toEqual([["refused", A, stagingOf(A)]]);
  expect((await state.list()).map((r) => r.volumeId)).toEqual([A]);
  unstageFails.clear();
  expect((await sweep.sweep()).unstaged).toEqual([A]);
  expect(reports).toEqual([
    ["refused", A, stagingOf(A)],
    ["unstaged", A, stagingOf(A)],
  ]);
});
