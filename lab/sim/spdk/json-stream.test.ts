// The receive-buffer scanner: complete, incomplete and malformed values, value counting, raw
// member text and duplicate keys.
import { expect, test } from "bun:test";
import { scanJsonValue } from "./json-stream.ts";

const scan = (s: string, at = 0) => scanJsonValue(Buffer.from(s), at);

test("finds where a value ends, with whitespace before and data after", () => {
  const r = scan(' \n {"a":[1,2,{"b":null}]}{"next":1}');
  expect(r.kind).toBe("value");
  if (r.kind !== "value") return;
  expect(r.value).toEqual({ a: [1, 2, { b: null }] });
  expect(r.end).toBe(' \n {"a":[1,2,{"b":null}]}'.length);
  // object 2 + name 1 + array 2 + 1 + 1 + object 2 + name 1 + null 1
  expect(r.values).toBe(11);
  expect(scan(' \n {"a":[1,2,{"b":null}]}{"next":1}', r.end).kind).toBe("value");
});

test("tells incomplete input from malformed input", () => {
  for (const s of ['{"a":', '{"a":tru', '{"a":"x\\', "[1,2", '{"a":1'])
    expect(scan(s).kind).toBe("incomplete");
  for (const s of ['{"a":1,,}', "hello world", '{"a":01}', '{"a":1,}', "{'a':1}", '{"a":"\u0001"}'])
    expect(scan(s).kind).toBe("invalid");
  expect(scan("  \n").kind).toBe("empty");
});

test("a bare top-level number is complete at the end of the buffer (SPDK answers `42`)", () => {
  const r = scan("42");
  expect(r.kind).toBe("value");
});

test("keeps the raw text of top-level members and flags repeated keys", () => {
  const r = scan('{"id":1.5e3,"method":"x","id":-0}');
  expect(r.kind).toBe("value");
  if (r.kind !== "value") return;
  expect(r.members?.map((m) => [m.key, m.raw])).toEqual([
    ["id", "1.5e3"],
    ["method", '"x"'],
    ["id", "-0"],
  ]);
  expect(r.duplicateKeys).toBe(true);
  const nested = scan('{"params":{"a":1,"a":2}}');
  expect(nested.kind === "value" && nested.duplicateKeys).toBe(true);
});

test("rejects invalid UTF-8 inside strings", () => {
  expect(scanJsonValue(Buffer.from([0x22, 0xff, 0x22])).kind).toBe("invalid");
});
