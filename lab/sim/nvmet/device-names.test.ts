import { expect, test } from "bun:test";
import type { Exec } from "../../../lib/exec.ts";
import { deviceNamedExec, nvmetDeviceResolver, parseDeviceNames, realDevicePath } from "./device-names.ts";

const names = { nvme0n1: "loop7", nvme1n1: "loop12" };

test.each([
  ["/dev/nvme0n1", "/dev/loop7"],
  ["/dev/nvme0n1p2", "/dev/loop7p2"],
  ["/dev/nvme1n1p10", "/dev/loop12p10"],
  ["/sys/class/block/nvme0n1p2/start", "/sys/class/block/loop7p2/start"],
  ["/sys/class/block/nvme0n1p2", "/sys/class/block/loop7p2"],
  // The whole disk's sysfs is the simulated one; unknown disks and other paths are not mapped.
  ["/sys/class/block/nvme0n1/size", undefined],
  ["/dev/nvme2n1", undefined],
  ["/dev/nvme0", undefined],
  ["/sys/kernel/config/nvmet/subsystems", undefined],
])("realDevicePath %s", (path, want) => {
  expect(realDevicePath(names, path)).toBe(want);
});

test("commands get loop devices, and nvmet modules load without the real kernel", async () => {
  const seen: string[][] = [];
  const inner: Exec = {
    run: async (argv) => {
      seen.push([...argv]);
      return { code: 0, stdout: "", stderr: "" };
    },
  };
  const exec = deviceNamedExec(inner, names);
  await exec.run(["parted", "-s", "/dev/nvme0n1", "mklabel", "gpt"]);
  await exec.run(["partx", "-d", "--nr", "2", "/dev/nvme1n1"]);
  expect((await exec.run(["modprobe", "nvmet-tcp"])).code).toBe(0);
  await exec.run(["modprobe", "loop"]);
  expect(seen).toEqual([
    ["parted", "-s", "/dev/loop7", "mklabel", "gpt"],
    ["partx", "-d", "--nr", "2", "/dev/loop12"],
    ["modprobe", "loop"],
  ]);
});

test("nvmet opens mapped device paths on the host and the rest under the node's root", () => {
  const resolve = nvmetDeviceResolver(names, "/lab/node");
  expect(resolve("/dev/nvme0n1p3")).toBe("/dev/loop7p3");
  expect(resolve("/dev/other")).toBe("/lab/node/dev/other");
});

test("a device map is parsed strictly", () => {
  expect(parseDeviceNames('{"nvme0n1":"loop3"}')).toEqual({ nvme0n1: "loop3" });
  expect(() => parseDeviceNames('{"sda":"loop3"}')).toThrow();
  expect(() => parseDeviceNames('{"nvme0n1":"/dev/loop3"}')).toThrow();
});
