// wholeNumber: accepts digits in range, names the setting in every refusal.
import { expect, test } from "bun:test";
import * as v from "valibot";
import { wholeNumber } from "./config-schemas.ts";

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
