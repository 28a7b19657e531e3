// Tests for the wipefs JSON parser, on output captured from util-linux 2.38.
import { expect, test } from "bun:test";
import { parseWipefs } from "./signatures.ts";

test("no signatures, in both shapes util-linux prints", () => {
  expect(parseWipefs("")).toEqual([]);
  expect(parseWipefs('{\n   "signatures": [\n\n   ]\n}\n')).toEqual([]);
});

test("signatures keep their type and offset", () => {
  const out = `{
   "signatures": [
      {
         "device": "loop0",
         "offset": "0x438",
         "type": "ext4",
         "uuid": "c5bed491-594e-45c9-828a-0782fc8aea43",
         "label": null
      },
      {"device": "loop0", "offset": "0x1fe", "type": "dos", "uuid": null, "label": null}
   ]
}`;
  expect(parseWipefs(out)).toEqual([
    { type: "ext4", offset: "0x438" },
    { type: "dos", offset: "0x1fe" },
  ]);
});

test.each(["not json", '{"sigs": []}', '{"signatures": [{"type": 1}]}'])("rejects %j", (out) => {
  expect(() => parseWipefs(out)).toThrow(expect.objectContaining({ kind: "internal" }));
});
