// Framing of SPDK's reply stream: any chunking yields the same objects, and every byte sequence
// SPDK would not send (including v25.05.1's cut-off replies to id-less requests) is refused.

import { describe, expect, test } from "bun:test";
import { JsonObjectStream, StreamFramingError } from "./json-stream.ts";
import { loadTranscript } from "./testing.ts";

const enc = new TextEncoder();
const records = loadTranscript();
const raw = (seq: number) => (records.find((r) => r.seq === seq) as { raw_response: string }).raw_response;

function feed(chunks: Uint8Array[], max = 1 << 20): unknown[] {
  const s = new JsonObjectStream({ maxValueBytes: max });
  const out: unknown[] = [];
  for (const c of chunks) s.push(c, (v) => out.push(v));
  return out;
}

function bytewise(text: string): Uint8Array[] {
  return [...enc.encode(text)].map((b) => Uint8Array.of(b));
}

describe("JsonObjectStream", () => {
  test("yields every reply of a chunk holding several, in order (transcript seq 146)", () => {
    const values = feed([enc.encode(raw(146))]) as Array<{ id: string }>;
    expect(values.map((v) => v.id)).toEqual(["r1", "r2", "r3"]);
  });

  test("byte-by-byte feeding gives the same values as one chunk (transcript seq 153, completion order)", () => {
    const text = raw(153);
    const whole = feed([enc.encode(text)]) as Array<{ id: string }>;
    expect(whole.map((v) => v.id)).toEqual(["fast-sync-2", "fast-sync-3", "very-slow-async"]);
    expect(feed(bytewise(text))).toEqual(whole);
  });

  test("tolerates whitespace and newlines between objects, and none at all", () => {
    const values = feed([enc.encode(' \n{"a":1}{"b":2}\r\n\t {"c":3}\n')]);
    expect(values).toEqual([{ a: 1 }, { b: 2 }, { c: 3 }]);
  });

  test("braces, brackets, escaped quotes and backslashes inside strings do not end an object", () => {
    const obj = { s: '}{ ][ \\" \\\\', t: "\\", u: ['"}'] };
    const text = JSON.stringify(obj);
    expect(feed(bytewise(text))).toEqual([obj]);
  });

  test("a multi-byte UTF-8 character split across chunks decodes", () => {
    const obj = { name: "größe-🚀" };
    const bytes = enc.encode(JSON.stringify(obj));
    const emoji = bytes.indexOf(0xf0);
    expect(feed([bytes.subarray(0, emoji + 2), bytes.subarray(emoji + 2)])).toEqual([obj]);
  });

  test("pendingBytes counts an unfinished object and drops to 0 when it completes", () => {
    const s = new JsonObjectStream({ maxValueBytes: 1024 });
    const got: unknown[] = [];
    s.push(enc.encode('{"id":1,"res'), (v) => got.push(v));
    expect(s.pendingBytes).toBe(12);
    expect(got).toEqual([]);
    s.push(enc.encode('ult":true}\n'), (v) => got.push(v));
    expect(s.pendingBytes).toBe(0);
    expect(got).toEqual([{ id: 1, result: true }]);
  });

  const refusals: Array<[string, string, RegExp]> = [
    ["a top-level array", "[]", /expected "\{"/],
    ["plain text", "hello world\n", /expected "\{"/],
    ["a fragment starting mid-object (seq 121: id-less bdev_get_bdevs)", raw(121), /expected "\{"/],
    [
      "a cut-off reply with the next glued on (seq 120: id-less call, then a normal one)",
      raw(120),
      /newline inside/,
    ],
    ["invalid JSON", '{"jsonrpc":"2.0","id":20,,}\n', /not valid JSON/],
  ];
  for (const [what, text, why] of refusals) {
    test(`refuses ${what}`, () => {
      expect(() => feed([enc.encode(text)])).toThrow(why);
    });
  }

  test("refuses invalid UTF-8", () => {
    const bytes = Uint8Array.from([...enc.encode('{"a":"'), 0xff, 0xfe, ...enc.encode('"}')]);
    expect(() => feed([bytes])).toThrow(StreamFramingError);
  });

  test("refuses an object larger than maxValueBytes, even while it is unfinished", () => {
    const s = new JsonObjectStream({ maxValueBytes: 64 });
    expect(() => s.push(enc.encode(`{"a":"${"x".repeat(100)}`), () => {})).toThrow(/exceeds 64 bytes/);
  });

  test("delivers the objects completed before the first bad byte", () => {
    const s = new JsonObjectStream({ maxValueBytes: 1024 });
    const got: unknown[] = [];
    expect(() =>
      s.push(enc.encode('{"id":1,"result":1}\n{"id":2,"result":2}\ngarbage'), (v) => got.push(v)),
    ).toThrow(StreamFramingError);
    expect(got).toEqual([
      { id: 1, result: 1 },
      { id: 2, result: 2 },
    ]);
  });
});
