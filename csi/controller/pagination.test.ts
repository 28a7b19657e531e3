// Keyset pagination: pages, tokens, bad tokens (ABORTED), and stability under concurrent change.
import { expect, test } from "bun:test";
import { StorageError } from "../../lib/errors.ts";
import { decodeToken, encodeToken, paginate } from "./pagination.ts";

const names = ["d", "a", "c", "b", "e"];
const id = (s: string) => s;

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

test("a token survives the deletion of its own entry and never repeats entries", () => {
  const first = paginate(names, id, 2, "");
  const rest = paginate(["a", "c", "d", "e", "bb"], id, 0, first.nextToken);
  expect(rest.entries).toEqual(["bb", "c", "d", "e"]);
});

const badTokens = [
  "invalid-token",
  "!!",
  encodeToken("x").slice(0, -1),
  Buffer.from("lv2:x").toString("base64url"),
  Buffer.from("lv1:").toString("base64url"),
];
for (const bad of badTokens) {
  test(`token ${JSON.stringify(bad)} is ABORTED`, () => {
    let err: unknown;
    try {
      paginate(names, id, 0, bad);
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(StorageError);
    expect((err as StorageError).kind).toBe("busy");
  });
}

test("tokens round-trip; a negative max_entries is INVALID_ARGUMENT", () => {
  expect(decodeToken(encodeToken("pvc-1"))).toBe("pvc-1");
  expect(() => paginate(names, id, -1, "")).toThrow("max_entries");
});
