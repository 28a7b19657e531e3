// The fabric's framing: every message survives encode and decode whatever the stream's chunking,
// block commands travel as binary capsules, numbers a capsule cannot hold fall back to JSON, and
// garbage is a FrameError.
import { expect, test } from "bun:test";
import { encodeFrame, encodeFrameParts, FrameDecoder, FrameError, type Message } from "./fabric-protocol.ts";

const messages: [Message, Uint8Array?][] = [
  [{ op: "read", tag: 1, nsid: 1, offset: 4096, length: 131072 }],
  [{ op: "write", tag: 2, nsid: 3, offset: 2 ** 40 + 512 }, Buffer.alloc(8192, 0x5a)],
  [{ op: "flush", tag: 3, nsid: 1 }],
  [{ op: "discard", tag: 4, nsid: 1, offset: 0, length: 6 * 2 ** 32 }],
  [{ op: "write_zeroes", tag: 5, nsid: 2, offset: 512, length: 1024 }],
  [{ op: "keep_alive", tag: 6 }],
  [{ op: "data", tag: 7 }, Buffer.from("payload bytes")],
  [{ op: "ok", tag: 8 }],
  [{ op: "error", tag: 9, errno: 5 }],
  [{ op: "ana", anaState: "inaccessible" }],
  [{ op: "rejected", tag: 10, reason: "host not allowed" }],
  [{ op: "auth_send", tag: 11 }, Buffer.from([1, 2, 3])],
];

function stream(): Buffer {
  return Buffer.concat(messages.map(([m, p]) => encodeFrame(m, p)));
}

test("every message decodes to itself, with its payload", () => {
  const got = new FrameDecoder().push(stream());
  expect(got.map((f) => f.msg)).toEqual(messages.map(([m]) => m));
  expect(got.map((f) => Buffer.from(f.payload).toString("hex"))).toEqual(
    messages.map(([, p]) => Buffer.from(p ?? []).toString("hex")),
  );
});

test("a stream cut into pieces of any size decodes the same", () => {
  const all = stream();
  const want = new FrameDecoder().push(all).map((f) => [f.msg, Buffer.from(f.payload).toString("hex")]);
  for (const size of [1, 3, 7, 8, 33, 1000, 4096]) {
    const dec = new FrameDecoder();
    const got: unknown[] = [];
    for (let at = 0; at < all.length; at += size) {
      // A fresh copy per piece, as a socket hands out.
      for (const f of dec.push(Buffer.from(all.subarray(at, at + size)))) {
        got.push([f.msg, Buffer.from(f.payload).toString("hex")]);
      }
    }
    expect(got).toEqual(want);
  }
});

test("block commands and completions are 32-byte capsules; other messages JSON", () => {
  expect(encodeFrame({ op: "read", tag: 1, nsid: 1, offset: 0, length: 4096 }).length).toBe(8 + 32);
  expect(encodeFrame({ op: "write", tag: 1, nsid: 1, offset: 0 }, Buffer.alloc(512)).length).toBe(
    8 + 32 + 512,
  );
  expect(encodeFrame({ op: "ok", tag: 1 }).readUInt32BE(4)).toBe(0xffffffff);
  const json = encodeFrame({ op: "ana", anaState: "optimized" });
  expect(JSON.parse(json.subarray(8).toString())).toEqual({ op: "ana", anaState: "optimized" });
});

test("numbers a capsule cannot hold travel as JSON and still decode", () => {
  const odd: Message[] = [
    { op: "read", tag: 2 ** 33, nsid: 1, offset: 0, length: 512 },
    { op: "error", tag: 1, errno: -5 },
    { op: "write", tag: 1, nsid: 1, offset: 0.5 },
  ];
  for (const m of odd) {
    const f = encodeFrame(m);
    expect(f.readUInt32BE(4)).not.toBe(0xffffffff);
    expect(new FrameDecoder().push(f)[0]?.msg).toEqual(m);
  }
});

test("garbage is a FrameError", () => {
  const capsule = encodeFrame({ op: "ok", tag: 1 });
  capsule[8] = 0x7f; // no such opcode
  expect(() => new FrameDecoder().push(capsule)).toThrow(FrameError);
  const short = Buffer.alloc(12);
  short.writeUInt32BE(8, 0);
  short.writeUInt32BE(0xffffffff, 4); // a capsule frame without its capsule
  expect(() => new FrameDecoder().push(short)).toThrow(FrameError);
  const huge = Buffer.alloc(8);
  huge.writeUInt32BE(2 ** 31, 0);
  expect(() => new FrameDecoder().push(huge)).toThrow(FrameError);
  const notJson = Buffer.concat([Buffer.from([0, 0, 0, 7, 0, 0, 0, 3]), Buffer.from("{{{")]);
  expect(() => new FrameDecoder().push(notJson)).toThrow(FrameError);
});

test("a large payload is a part of its own, the same bytes as the whole frame", () => {
  const m: Message = { op: "data", tag: 3 };
  const big = Buffer.alloc(64 * 1024, 7);
  const parts = encodeFrameParts(m, big);
  expect(parts.length).toBe(2);
  expect(parts[1]).toBe(big);
  expect(Buffer.concat(parts).equals(encodeFrame(m, big))).toBe(true);
  expect(encodeFrameParts(m, Buffer.alloc(100)).length).toBe(1);
});
