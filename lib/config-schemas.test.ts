// wholeNumber: accepts digits in range, names the setting in every refusal.
import { expect, test } from "bun:test";
import * as v from "valibot";
import { goDuration, wholeNumber } from "./config-schemas.ts";

const problem = (schema: ReturnType<typeof wholeNumber>, input: string) => {
  const r = v.safeParse(schema, input);
  return r.success ? undefined : r.issues[0].message;
};

test("parses digits within the bounds, inclusive", () => {
  const port = wholeNumber(0, 65535, "health-port");
  expect(v.parse(port, "0")).toBe(0);
  expect(v.parse(port, "65535")).toBe(65535);
  expect(v.parse(wholeNumber(1), "9007199254740991")).toBe(Number.MAX_SAFE_INTEGER);
});

test("refuses anything else with a message naming the setting", () => {
  const port = wholeNumber(1, 65535, "DISTORT_HEALTH_PORT");
  expect(problem(port, "70000")).toBe("DISTORT_HEALTH_PORT must be <= 65535");
  expect(problem(port, "0")).toBe("DISTORT_HEALTH_PORT must be >= 1");
  for (const bad of ["fast", "-1", "1e3", " 5", "", "5.0"])
    expect(problem(port, bad)).toBe("DISTORT_HEALTH_PORT must be a whole number");
  expect(problem(wholeNumber(1000), "5")).toBe("must be >= 1000");
  expect(problem(wholeNumber(1000), "x")).toBe("must be a whole number");
  expect(problem(wholeNumber(0, Number.MAX_SAFE_INTEGER), "9007199254740993")).toBe(
    `must be <= ${Number.MAX_SAFE_INTEGER}`,
  );
});

test("goDuration reads Go duration strings as whole milliseconds", () => {
  const d = goDuration(0, 86_400_000, "--probe-timeout");
  const cases: [string, number][] = [
    ["3s", 3000],
    ["1m30s", 90_000],
    ["1.5s", 1500],
    ["250ms", 250],
    ["2h", 7_200_000],
    [".5s", 500],
    ["1500us", 2],
    ["1ns", 1],
    ["0", 0],
    ["0s", 0],
  ];
  for (const [s, ms] of cases) expect({ s, ms: v.parse(d, s) }).toEqual({ s, ms });
});

test("goDuration refuses what Go refuses, and out-of-range values, naming the flag", () => {
  const d = goDuration(1, 60_000, "--timeout");
  const problemOf = (s: string) => {
    const r = v.safeParse(d, s);
    return r.success ? undefined : r.issues[0].message;
  };
  for (const bad of ["3", "-1s", "3 s", "s", "1d", "", "1s2", "+1s"])
    expect({ bad, msg: problemOf(bad) }).toEqual({
      bad,
      msg: "--timeout must be a duration such as 500ms, 3s or 1m30s",
    });
  expect(problemOf("0s")).toBe("--timeout must be at least 1 ms");
  expect(problemOf("61s")).toBe("--timeout must be at most 60000 ms");
});
