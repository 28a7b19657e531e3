// retryOnConflict's loop rules, driven by scripted attempts: stop, write, retry on conflict, give
// up after the budget, not-found as gone, other errors through. The writes against a real
// apiserver are exercised by updateStatus in cache.int.test.ts.
import { expect, test } from "bun:test";
import { StorageError } from "../errors.ts";
import { type Attempt, retryOnConflict } from "./retry-on-conflict.ts";

/** Attempts that write with the given outcomes in turn, counting reads. */
function script(outcomes: readonly (string | StorageError | Error)[]) {
  let reads = 0;
  const attempt = async (): Promise<Attempt<string>> => {
    const outcome = outcomes[reads++];
    if (outcome === undefined) return { done: "no write needed" };
    return {
      write: async () => {
        if (typeof outcome === "string") return outcome;
        throw outcome;
      },
    };
  };
  return { attempt, reads: () => reads };
}

const conflict = () => new StorageError("conflict", "resourceVersion moved");

test("a done attempt returns its value without writing", async () => {
  const s = script([]);
  expect(await retryOnConflict("status of x", 5, s.attempt)).toBe("no write needed");
  expect(s.reads()).toBe(1);
});

test("conflicts start over from a fresh read until a write lands", async () => {
  const s = script([conflict(), conflict(), "stored"]);
  expect(await retryOnConflict("status of x", 5, s.attempt)).toBe("stored");
  expect(s.reads()).toBe(3);
  // A re-read that finds nothing left to do ends the loop as well.
  const t = script([conflict()]);
  expect(await retryOnConflict("status of x", 5, t.attempt)).toBe("no write needed");
  expect(t.reads()).toBe(2);
});

test("gives up with a conflict after the budget, keeping the last conflict as cause", async () => {
  const last = conflict();
  const s = script([conflict(), conflict(), last, "never reached"]);
  const err = (await retryOnConflict("finalizers of c", 3, s.attempt).catch((e) => e)) as StorageError;
  expect(err).toBeInstanceOf(StorageError);
  expect(err.kind).toBe("conflict");
  expect(err.message).toBe("finalizers of c: 3 conflicting writes in a row");
  expect(err.cause).toBe(last);
  expect(s.reads()).toBe(3);
});

test("not-found during the write is 'gone'; any other error propagates at once", async () => {
  const gone = script([new StorageError("not-found", "deleted meanwhile")]);
  expect(await retryOnConflict("status of x", 5, gone.attempt)).toBeUndefined();
  const boom = new StorageError("unavailable", "apiserver down");
  const s = script([boom, "never reached"]);
  expect(await retryOnConflict("status of x", 5, s.attempt).catch((e) => e)).toBe(boom);
  expect(s.reads()).toBe(1);
});
