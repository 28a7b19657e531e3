import { expect, test } from "bun:test";
import { BLOCK_BYTES, blockContent, checkBlock, parseBlock, WriteLog } from "./write-log.ts";

test("a block's content names its block and write, and nothing else parses as it", () => {
  const b = blockContent(7, 3, 12);
  expect(b.length).toBe(BLOCK_BYTES);
  expect(parseBlock(7, 3, b)).toEqual({ kind: "seq", seq: 12 });
  expect(parseBlock(7, 4, b)).toEqual({ kind: "garbage" });
  expect(parseBlock(8, 3, b)).toEqual({ kind: "garbage" });
  const torn = Buffer.from(b);
  torn[BLOCK_BYTES - 1] = (torn[BLOCK_BYTES - 1] ?? 0) ^ 1;
  expect(parseBlock(7, 3, torn)).toEqual({ kind: "garbage" });
  expect(parseBlock(7, 3, Buffer.alloc(BLOCK_BYTES))).toEqual({ kind: "zero" });
  expect(blockContent(7, 3, 13).equals(b)).toBe(false);
});

test("a block holds its last acknowledged write or a later attempted one; anything older is a loss", () => {
  const log = new WriteLog(2);
  expect(checkBlock(log, 1, 0, Buffer.alloc(BLOCK_BYTES))).toBeUndefined();
  for (const seq of [1, 2, 3]) {
    expect(log.next(0)).toBe(seq);
    log.attempt(0, seq);
    log.ack(0, seq);
  }
  // Write 4 attempted, retried, never acknowledged: 3 or 4 may be there.
  log.attempt(0, 4);
  log.attempt(0, 4);
  expect(log.next(0)).toBe(5);
  expect(log.acknowledged).toBe(3);
  expect(log.attempts).toBe(5);
  expect(checkBlock(log, 1, 0, blockContent(1, 0, 3))).toBeUndefined();
  expect(checkBlock(log, 1, 0, blockContent(1, 0, 4))).toBeUndefined();
  expect(checkBlock(log, 1, 0, blockContent(1, 0, 2))).toMatchObject({
    block: 0,
    acked: 3,
    found: expect.stringContaining("older"),
  });
  expect(checkBlock(log, 1, 0, blockContent(1, 0, 5))).toMatchObject({
    found: expect.stringContaining("never attempted"),
  });
  expect(checkBlock(log, 1, 0, Buffer.alloc(BLOCK_BYTES))).toMatchObject({ found: "zeros" });
  expect(checkBlock(log, 1, 0, blockContent(1, 1, 3))).toMatchObject({ found: "garbage" });
  // An unacknowledged first write may or may not have landed.
  log.attempt(1, 1);
  expect(checkBlock(log, 1, 1, Buffer.alloc(BLOCK_BYTES))).toBeUndefined();
  expect(checkBlock(log, 1, 1, blockContent(1, 1, 1))).toBeUndefined();
});
