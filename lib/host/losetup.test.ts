// losetup argv and --list --json parsing (util-linux 2.38 output, older string forms too).
import { expect, test } from "bun:test";
import { StorageError } from "../errors.ts";
import { attachArgv, detachArgv, parseAttached, parseLosetupList, setCapacityArgv } from "./losetup.ts";

test.each<[string, Parameters<typeof attachArgv>[1], string[]]>([
  ["whole file", {}, ["losetup", "--find", "--show", "/data/ns.img"]],
  ["read-only", { readonly: true }, ["losetup", "--find", "--show", "--read-only", "/data/ns.img"]],
  [
    "extent",
    { offset: 1048576, sizeLimit: 67108864 },
    ["losetup", "--find", "--show", "--offset", "1048576", "--sizelimit", "67108864", "/data/ns.img"],
  ],
  [
    "zero offset and limit are left out",
    { offset: 0, sizeLimit: 0 },
    ["losetup", "--find", "--show", "/data/ns.img"],
  ],
])("attach %s", (_name, opts, want) => {
  expect(attachArgv("/data/ns.img", opts)).toEqual(want);
});

test("detach and set-capacity", () => {
  expect(detachArgv("/dev/loop3")).toEqual(["losetup", "--detach", "/dev/loop3"]);
  expect(setCapacityArgv("/dev/loop3")).toEqual(["losetup", "--set-capacity", "/dev/loop3"]);
});

test("parses the list", () => {
  const text = `{
   "loopdevices": [
      {"name": "/dev/loop1", "back-file": "/dev/loop0", "ro": true, "offset": 0, "sizelimit": 0},
      {"name": "/dev/loop0", "back-file": "/tmp/a.img (deleted)", "ro": "0", "offset": "4096", "sizelimit": "8192"}
   ]
}`;
  expect(parseLosetupList(text)).toEqual([
    { name: "/dev/loop1", backFile: "/dev/loop0", readonly: true, offset: 0, sizeLimit: 0 },
    { name: "/dev/loop0", backFile: "/tmp/a.img (deleted)", readonly: false, offset: 4096, sizeLimit: 8192 },
  ]);
  expect(parseLosetupList("")).toEqual([]);
});

test.each(["not json", '{"devices": []}', '{"loopdevices": [{"name": "loop0"}]}'])("rejects %j", (text) => {
  expect(() => parseLosetupList(text)).toThrow(StorageError);
});

test("parseAttached accepts only a loop device name", () => {
  expect(parseAttached("/dev/loop7\n")).toBe("/dev/loop7");
  expect(() => parseAttached("losetup: cannot find an unused loop device")).toThrow(StorageError);
});
