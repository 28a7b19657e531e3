// Keyset pagination: pages in byte order, tokens, bad tokens (ABORTED), and stability while
// entries come and go between pages.
import { expect, test } from "bun:test";
import { StorageError } from "./errors.ts";
import { decodeToken, encodeToken, paginate } from "./keyset-pagination.ts";

const names = ["d", "a", "c", "b", "e"];
const id = (s: string) => s;

function kindOf(f: () => unknown): string | undefined {
  try {
    f();
  } catch (e) {
    expect(e).toBeInstanceOf(StorageError);
    return (e as StorageError).kind;
  }
  return undefined;
}

test("max_entries 0 lists everything, sorted", () => {
  expect(paginate(names, id, 0, "")).toEqual({ entries: ["a", "b", "c", "d", "e"], nextToken: "" });
});

test("pages chain through next tokens until the empty token", () => {
  const seen: string[] = [];
  let token = "";
  let pages = 0;
  do {
    const p = paginate(names, id, 2, token);
    seen.push(...p.entries);
    token = p.nextToken;
    pages++;
  } while (token !== "");
  expect(seen).toEqual(["a", "b", "c", "d", "e"]);
  expect(pages).toBe(3);
});

test("pages in byte order until the token is empty; 0 means everything", () => {
  const items = ["b", "a", "é", "Z", "c"];
  expect(paginate(items, id, 0, "").entries).toEqual(["Z", "a", "b", "c", "é"]);
  const p1 = paginate(items, id, 2, "");
  expect(p1.entries).toEqual(["Z", "a"]);
  const p2 = paginate(items, id, 2, p1.nextToken);
  expect(p2.entries).toEqual(["b", "c"]);
  const p3 = paginate(items, id, 2, p2.nextToken);
  expect(p3).toEqual({ entries: ["é"], nextToken: "" });
  expect(paginate(items, id, 5, "")).toEqual({ entries: ["Z", "a", "b", "c", "é"], nextToken: "" });
});

test("byte order, not UTF-16 order: a character beyond the BMP sorts after U+FFFD", () => {
  // UTF-16 code units would put the surrogate pair (0xD83D...) before U+FFFD.
  expect(paginate(["😀", "\uFFFD"], id, 0, "").entries).toEqual(["\uFFFD", "😀"]);
});

test("a token survives the deletion of its own entry and never repeats entries", () => {
  const first = paginate(names, id, 2, "");
  const rest = paginate(["a", "c", "d", "e", "bb"], id, 0, first.nextToken);
  expect(rest.entries).toEqual(["bb", "c", "d", "e"]);
});

test("items added or removed between pages: no repeat, nothing that stayed is skipped", () => {
  const p1 = paginate(["a", "c", "e"], id, 2, "");
  // "c" (the cursor) is deleted, "b" added behind, "d" ahead.
  const p2 = paginate(["a", "b", "d", "e"], id, 2, p1.nextToken);
  expect([...p1.entries, ...p2.entries]).toEqual(["a", "c", "d", "e"]);
});

const badTokens = [
  "x",
  "invalid-token",
  "!!",
  "!!!",
  "bm90LWEtdG9rZW4",
  encodeToken("x").slice(0, -1),
  `${encodeToken("vol-1")}A`,
  // Other prefixes, including the two this format replaced (lv1: for CSI, dpu1: for DPF).
  Buffer.from("lv2:x").toString("base64url"),
  Buffer.from("lv1:x").toString("base64url"),
  Buffer.from("dpu1:x").toString("base64url"),
  // The right prefix with no key.
  Buffer.from("ks1:").toString("base64url"),
  // A key no issued token names: a control character.
  Buffer.from("ks1:a\nb").toString("base64url"),
];
for (const bad of badTokens) {
  test(`token ${JSON.stringify(bad)} is ABORTED`, () => {
    expect(kindOf(() => paginate(names, id, 0, bad))).toBe("busy");
    expect(kindOf(() => paginate(["a"], id, 1, bad))).toBe("busy");
  });
}

test("tokens round-trip any key; a negative max_entries is INVALID_ARGUMENT", () => {
  for (const k of ["pvc-1", "vol-1", "ns/päth", " "]) expect(decodeToken(encodeToken(k))).toBe(k);
  expect(() => paginate(names, id, -1, "")).toThrow("max_entries");
  expect(kindOf(() => paginate(names, id, -1, ""))).toBe("invalid");
});
