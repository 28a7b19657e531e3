// ListDevices paging: stable byte order, pages that neither repeat nor skip while items come and go,
// and ABORTED ("busy") for tokens this plugin never issued.
import { expect, test } from "bun:test";
import { StorageError } from "../../lib/errors.ts";
import { decodeToken, encodeToken, paginate } from "./pagination.ts";

const id = (s: string) => s;

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

test("items added or removed between pages: no repeat, nothing that stayed is skipped", () => {
  const p1 = paginate(["a", "c", "e"], id, 2, "");
  // "c" (the cursor) is deleted, "b" added behind, "d" ahead.
  const p2 = paginate(["a", "b", "d", "e"], id, 2, p1.nextToken);
  expect([...p1.entries, ...p2.entries]).toEqual(["a", "c", "d", "e"]);
});

test("tokens round-trip any key; foreign or altered tokens are ABORTED", () => {
  for (const k of ["vol-1", "ns/päth", " "]) expect(decodeToken(encodeToken(k))).toBe(k);
  for (const bad of [
    "",
    "!!!",
    "bm90LWEtdG9rZW4",
    Buffer.from("dpu1:").toString("base64url"),
    `${encodeToken("vol-1")}A`,
  ]) {
    let err: unknown;
    try {
      paginate(["a"], id, 1, bad === "" ? "x" : bad);
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(StorageError);
    expect((err as StorageError).kind).toBe("busy");
  }
});
