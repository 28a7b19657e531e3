// The group snapshot helpers: names and ids, the CSI message of a group, and refusals.
import { expect, test } from "bun:test";
import { exampleNVMeSnapshot } from "../../api/examples.ts";
import { GROUP_SNAPSHOT_LABEL, GROUP_SPANS_NODES_REASON, type NVMeSnapshot } from "../../api/index.ts";
import {
  formatGroupId,
  groupInfo,
  groupNameFor,
  groupRefusal,
  memberNameFor,
  parseGroupId,
} from "./group-snapshots.ts";
import { snapshotInfo } from "./snapshots.ts";

function member(name: string, mut: (s: NVMeSnapshot) => void = () => {}): NVMeSnapshot {
  const s = exampleNVMeSnapshot();
  s.metadata.name = name;
  s.metadata.uid = `uid-${name}`;
  mut(s);
  return s;
}

test("group names: a DNS label stays itself, anything else becomes a stable hash that is a label", () => {
  expect(groupNameFor("groupsnapshot-1a2b")).toBe("groupsnapshot-1a2b");
  const long = groupNameFor(`groupsnapshot-${"x".repeat(100)}`);
  expect(long).toMatch(/^grp-[0-9a-f]{24}$/);
  expect(groupNameFor(`groupsnapshot-${"x".repeat(100)}`)).toBe(long);
  expect(groupNameFor("Upper_Case")).toMatch(/^grp-/);
});

test("member names are deterministic per (group, source) and differ across both", () => {
  const a = memberNameFor("g", "ns/vol-a/uid-a");
  expect(a).toMatch(/^gs-[0-9a-f]{24}$/);
  expect(memberNameFor("g", "ns/vol-a/uid-a")).toBe(a);
  expect(memberNameFor("g", "ns/vol-b/uid-b")).not.toBe(a);
  expect(memberNameFor("h", "ns/vol-a/uid-a")).not.toBe(a);
});

test("group ids round-trip in their namespace; anything else is not ours", () => {
  expect(parseGroupId(formatGroupId("distort-system", "g-1"), "distort-system")).toBe("g-1");
  expect(parseGroupId("other/g-1", "distort-system")).toBeUndefined();
  expect(parseGroupId("distort-system/g-1/uid", "distort-system")).toBeUndefined();
  expect(parseGroupId("distort-system/Not_A_Label", "distort-system")).toBeUndefined();
  expect(parseGroupId("", "distort-system")).toBeUndefined();
});

test("a group is ready only when every member is; it carries its id on each member", () => {
  const ready = (s: NVMeSnapshot) => {
    s.status = { ...s.status, readyToUse: true, conditions: [], creationTime: "2026-01-01T00:00:05Z" };
  };
  const both = groupInfo("ns/g", [member("a", ready), member("b", ready)], "ns");
  expect(both.readyToUse).toBe(true);
  expect(both.snapshots?.map((s) => s.groupSnapshotId)).toEqual(["ns/g", "ns/g"]);
  const one = groupInfo(
    "ns/g",
    [member("a", ready), member("b", (s) => (s.status = { conditions: [] }))],
    "ns",
  );
  expect(one.readyToUse).toBe(false);
  expect(groupInfo("ns/g", [], "ns").readyToUse).toBe(false);
});

test("refusals: a member on a group spanning nodes or a refused member ends the wait; pending does not", () => {
  const cond = (reason: string) => (s: NVMeSnapshot) => {
    s.status = {
      conditions: [
        {
          type: "Ready",
          status: "False",
          reason,
          message: `because ${reason}`,
          lastTransitionTime: "2026-01-01T00:00:00Z",
        },
      ],
    };
  };
  expect(groupRefusal([member("a"), member("b", cond(GROUP_SPANS_NODES_REASON))])).toBe(
    `because ${GROUP_SPANS_NODES_REASON}`,
  );
  expect(groupRefusal([member("a", cond("SourceNotFound"))])).toBe("because SourceNotFound");
  expect(groupRefusal([member("a", cond("SourceNotExported")), member("b")])).toBeUndefined();
});

test("snapshotInfo (ListSnapshots, CreateSnapshot) names a member's group and leaves others without one", () => {
  const inGroup = member("a", (s) => {
    s.metadata.labels = { [GROUP_SNAPSHOT_LABEL]: "g-1" };
  });
  expect(snapshotInfo(inGroup, "ns").groupSnapshotId).toBe("ns/g-1");
  expect(snapshotInfo(member("b"), "ns").groupSnapshotId).toBeUndefined();
});
