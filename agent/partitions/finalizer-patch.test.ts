// The finalizer patch's preconditions: the object's incarnation and its finalizers as last seen.
import { expect, test } from "bun:test";
import { exampleNVMePartition } from "../../api/examples.ts";
import { PARTITION_FINALIZER } from "./decide.ts";
import { addFinalizerOps } from "./finalizer-patch.ts";

test("no finalizers yet: tests the member is missing, then creates the list", () => {
  const p = exampleNVMePartition();
  delete p.metadata.finalizers;
  expect(addFinalizerOps(p, PARTITION_FINALIZER)).toEqual([
    { op: "test", path: "/metadata/uid", value: p.metadata.uid },
    { op: "test", path: "/metadata/finalizers", value: null },
    { op: "add", path: "/metadata/finalizers", value: [PARTITION_FINALIZER] },
  ]);
});

test("an empty list counts as none", () => {
  const p = exampleNVMePartition();
  p.metadata.finalizers = [];
  expect(addFinalizerOps(p, PARTITION_FINALIZER)[1]).toEqual({
    op: "test",
    path: "/metadata/finalizers",
    value: null,
  });
});

test("other finalizers: tests the list as seen, then appends", () => {
  const p = exampleNVMePartition();
  p.metadata.finalizers = ["example.com/hold"];
  expect(addFinalizerOps(p, PARTITION_FINALIZER)).toEqual([
    { op: "test", path: "/metadata/uid", value: p.metadata.uid },
    { op: "test", path: "/metadata/finalizers", value: ["example.com/hold"] },
    { op: "add", path: "/metadata/finalizers/-", value: PARTITION_FINALIZER },
  ]);
});
