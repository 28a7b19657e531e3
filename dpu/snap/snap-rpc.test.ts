// The SNAP-only RPCs and the NBD BlockDevices built on them, against a scripted SpdkRpc: exact
// method names and params, reply parsing, and what a SNAP without these methods means.
import { expect, test } from "bun:test";
import type { StorageError } from "../../lib/errors.ts";
import type { SpdkRpc } from "../../lib/spdk/client.ts";
import { SpdkError } from "../../lib/spdk/errors.ts";
import { snapNbdBlockDevices } from "../devices/block-devices.ts";
import { SnapRpc } from "./snap-rpc.ts";

type Reply = unknown | ((params: unknown) => unknown);

/** Answers each method from `replies` (a function may throw); records [method, params]. */
function scripted(replies: Record<string, Reply>): SpdkRpc & { calls: [string, unknown][] } {
  const calls: [string, unknown][] = [];
  return {
    calls,
    async call(method, params) {
      calls.push([method, params]);
      if (!(method in replies)) throw new SpdkError(method, -32601, "Method not found");
      const r = replies[method];
      return typeof r === "function" ? (r as (p: unknown) => unknown)(params) : r;
    },
    serialize: (_k, fn) => fn(),
  };
}

test("fsdev_get_fsdevs is parsed, and undefined on a SNAP without it", async () => {
  const list = [{ name: "fs0", module_name: "aio", module_specific: { name: "fs0", root_path: "/m/a" } }];
  expect(await new SnapRpc(scripted({ fsdev_get_fsdevs: list })).fsdevGetFsdevs()).toEqual(list);
  expect(await new SnapRpc(scripted({})).fsdevGetFsdevs()).toBeUndefined();
  const bad = await new SnapRpc(scripted({ fsdev_get_fsdevs: [{ nom: "x" }] }))
    .fsdevGetFsdevs()
    .catch((e: StorageError) => e);
  expect((bad as StorageError).kind).toBe("internal");
});

test("NBD: export reuses an existing disk, starts one otherwise; unexport stops it; exact JSON", async () => {
  const disks = [{ nbd_device: "/dev/nbd0", bdev_name: "distort_aan1" }];
  const rpc = scripted({
    nbd_get_disks: () => disks,
    nbd_start_disk: (p: unknown) => {
      disks.push({ nbd_device: "/dev/nbd1", bdev_name: (p as { bdev_name: string }).bdev_name });
      return "/dev/nbd1";
    },
    nbd_stop_disk: (p: unknown) => {
      const at = disks.findIndex((d) => d.nbd_device === (p as { nbd_device: string }).nbd_device);
      if (at < 0) throw new SpdkError("nbd_stop_disk", -19, "No such device");
      disks.splice(at, 1);
      return true;
    },
  });
  const b = snapNbdBlockDevices(new SnapRpc(rpc));
  expect(await b.export("distort_aan1")).toBe("/dev/nbd0");
  expect(await b.export("distort_bbn1")).toBe("/dev/nbd1");
  expect(rpc.calls.filter(([m]) => m === "nbd_start_disk")).toEqual([
    ["nbd_start_disk", { bdev_name: "distort_bbn1" }],
  ]);
  expect([...(await b.list())]).toEqual([
    ["distort_aan1", "/dev/nbd0"],
    ["distort_bbn1", "/dev/nbd1"],
  ]);
  await b.unexport("distort_aan1");
  await b.unexport("distort_aan1");
  expect(rpc.calls.filter(([m]) => m === "nbd_stop_disk")).toEqual([
    ["nbd_stop_disk", { nbd_device: "/dev/nbd0" }],
  ]);
  expect(rpc.calls.filter(([m]) => m === "nbd_get_disks").every(([, p]) => p === undefined)).toBe(true);
});

test("NBD on a SNAP without it: nothing is exported, and exporting is a precondition failure", async () => {
  const b = snapNbdBlockDevices(new SnapRpc(scripted({})));
  expect((await b.list()).size).toBe(0);
  await b.unexport("distort_aan1");
  const e = await b.export("distort_aan1").catch((x: StorageError) => x);
  expect((e as StorageError).kind).toBe("precondition");
  expect((e as Error).message).toContain("nbd_start_disk is missing");
});

test("a malformed nbd_start_disk reply is internal", async () => {
  const b = snapNbdBlockDevices(new SnapRpc(scripted({ nbd_get_disks: [], nbd_start_disk: true })));
  expect(((await b.export("x").catch((e: StorageError) => e)) as StorageError).kind).toBe("internal");
});
