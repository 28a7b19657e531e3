// The valibot -> JSON Schema conversion behind helm/distort/values.schema.json, on small schemas:
// a pipe nested in a pipe (port(), ms(), intRange() under a description) keeps every constraint of
// the inner pipe, an outer bound narrows it, and a construct with no faithful form is refused.
import { describe, expect, test } from "bun:test";
import * as v from "valibot";
import { intRange } from "../api/common.ts";
import { flattenPipe, jsonSchemaOf, ValuesSchemaError, valuesJsonSchema } from "./gen-values-schema.ts";

type Node = { [key: string]: unknown };
/** The node at `path` (dotted property names) of a generated object schema. */
function at(schema: Node, path: string): Node {
  return path.split(".").reduce<Node>((s, k) => (s.properties as Record<string, Node>)[k] as Node, schema);
}

describe("nested pipes", () => {
  test("a described intRange keeps integer, minimum and maximum", () => {
    expect(jsonSchemaOf(v.pipe(intRange(1, 65535), v.description("port")))).toEqual({
      type: "integer",
      minimum: 1,
      maximum: 65535,
      description: "port",
    });
  });

  test("three levels deep, with the innermost actions first and the outermost description last", () => {
    const inner = v.pipe(v.number(), v.integer(), v.minValue(0));
    const middle = v.pipe(inner, v.maxValue(100), v.description("middle"));
    expect(jsonSchemaOf(v.pipe(middle, v.multipleOf(5), v.description("outer")))).toEqual({
      type: "integer",
      minimum: 0,
      maximum: 100,
      multipleOf: 5,
      description: "outer",
    });
  });

  test("an outer bound narrows the inner one and never widens it", () => {
    expect(jsonSchemaOf(v.pipe(intRange(0, 100), v.minValue(10), v.maxValue(50)))).toMatchObject({
      minimum: 10,
      maximum: 50,
    });
    expect(jsonSchemaOf(v.pipe(intRange(10, 50), v.minValue(0), v.maxValue(100)))).toMatchObject({
      minimum: 10,
      maximum: 50,
    });
    expect(jsonSchemaOf(v.pipe(v.pipe(v.string(), v.minLength(2), v.maxLength(9)), v.maxLength(20)))).toEqual(
      { type: "string", minLength: 2, maxLength: 9 },
    );
  });

  test("inside unions, arrays and optional object entries", () => {
    const port = v.pipe(intRange(1, 65535), v.description("p"));
    const s = jsonSchemaOf(
      v.strictObject({
        u: v.union([v.literal(0), v.pipe(intRange(64, 1024), v.description("MiB"))]),
        list: v.pipe(v.array(port), v.maxLength(3)),
        opt: v.optional(port),
      }),
    );
    expect(at(s, "u")).toEqual({
      anyOf: [{ const: 0 }, { type: "integer", minimum: 64, maximum: 1024, description: "MiB" }],
    });
    expect(at(s, "list")).toEqual({
      type: "array",
      items: { type: "integer", minimum: 1, maximum: 65535, description: "p" },
      maxItems: 3,
    });
    expect(at(s, "opt")).toMatchObject({ type: "integer", minimum: 1, maximum: 65535 });
    expect(s.required).toEqual(["u", "list"]);
  });

  test("an unbounded maximum (intRange's MAX_SAFE_INTEGER) is left out", () => {
    expect(jsonSchemaOf(v.pipe(intRange(1, Number.MAX_SAFE_INTEGER), v.description("n")))).toEqual({
      type: "integer",
      minimum: 1,
      description: "n",
    });
  });

  test("what one JSON Schema keyword cannot hold is refused, naming the path", () => {
    const twoPatterns = v.pipe(v.pipe(v.string(), v.regex(/^a/)), v.regex(/b$/));
    expect(() => jsonSchemaOf(twoPatterns, "x.y")).toThrow(ValuesSchemaError);
    expect(() => jsonSchemaOf(twoPatterns, "x.y")).toThrow("x.y: two patterns in one pipe");
    const twoSteps = v.pipe(v.pipe(v.number(), v.multipleOf(2)), v.multipleOf(3));
    expect(() => jsonSchemaOf(twoSteps)).toThrow("two multipleOf()");
    // A check() inside a nested pipe still needs its JSON Schema twin right after it.
    const unchecked = v.pipe(
      v.pipe(
        v.number(),
        v.check((n) => n > 1, "big"),
      ),
      v.description("d"),
    );
    expect(() => jsonSchemaOf(unchecked)).toThrow("check() must be followed by metadata({ jsonSchema })");
  });

  test("flattenPipe: the root schema, then every action innermost first", () => {
    const flat = flattenPipe(v.pipe(v.pipe(v.number(), v.integer()), v.minValue(1)) as never);
    expect(flat.map((x) => `${x.kind}:${x.type}`)).toEqual([
      "schema:number",
      "validation:integer",
      "validation:min_value",
    ]);
    expect(flattenPipe(v.string() as never).map((x) => x.type)).toEqual(["string"]);
  });
});

describe("the chart's values schema", () => {
  const s = valuesJsonSchema();
  test.each([
    ["agent.portal.port", 1, 65535],
    ["agent.healthPort", 1, 65535],
    ["agent.reportPeriodMs", 1000, 3_600_000],
    ["agent.rebuild.perNode", 0, 64],
  ])("%s (a nested pipe) is an integer from %d to %d", (path, min, max) => {
    expect(at(s, path)).toMatchObject({ type: "integer", minimum: min, maximum: max });
  });

  test("no number in it is left without the integer type its valibot source gives", () => {
    // Every number value of the chart is a whole count, port, period or bound, except resource
    // quantities ("cpu: 0.5") and two alert thresholds, which take fractions.
    const fractional = /(\.(cpu|memory|ephemeral-storage)\|1|\.lvstoreFullPercent|\.ioLatencySeconds)$/;
    const loose: string[] = [];
    const walk = (n: Node, path: string): void => {
      if (n.type === "number" && !fractional.test(path)) loose.push(path);
      for (const [k, c] of Object.entries((n.properties as Record<string, Node>) ?? {}))
        walk(c, `${path}.${k}`);
      for (const [i, c] of ((n.anyOf as Node[]) ?? []).entries()) walk(c, `${path}|${i}`);
      if (n.items) walk(n.items as Node, `${path}[]`);
      if (typeof n.additionalProperties === "object") walk(n.additionalProperties as Node, `${path}{}`);
    };
    walk(s, "values");
    expect(loose).toEqual([]);
  });
});
