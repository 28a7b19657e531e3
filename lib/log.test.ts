// redact(): secret-looking fields are replaced at every depth it walks, and past its depth limit it
// fails closed (the subtree becomes a marker) instead of passing the deep object through as is.
import { describe, expect, test } from "bun:test";
import { createLogger, REDACTED, redact, redactText, TOO_DEEP } from "./log.ts";
import { generateDhchapSecret } from "./nvme/dhchap.ts";

/** An object `levels` deep whose innermost level holds a dhchap_key. */
function nested(levels: number): Record<string, unknown> {
  let inner: Record<string, unknown> = { dhchap_key: "DHHC-1:01:deep-secret:" };
  for (let i = 0; i < levels; i++) inner = { next: inner };
  return inner;
}

describe("redact", () => {
  test("replaces secret fields at a shallow depth and keeps the rest", () => {
    const out = redact({ volume: "v1", auth: { dhchapKey: "s", psk: "p", key: "queue-key" } });
    expect(out).toEqual({ volume: "v1", auth: { dhchapKey: REDACTED, psk: REDACTED, key: "queue-key" } });
  });

  test("a secret beyond the depth limit does not come through", () => {
    for (const levels of [3, 8, 12, 40]) {
      const text = JSON.stringify(redact(nested(levels)));
      expect(text).not.toContain("deep-secret");
      expect(text).toContain(levels <= 8 ? REDACTED : TOO_DEEP);
    }
  });

  test("a cycle ends in a marker, not a stack overflow", () => {
    const a: Record<string, unknown> = { name: "a" };
    a.self = a;
    const text = JSON.stringify(redact(a));
    expect(text).toContain('"name":"a"');
    expect(text).toContain(TOO_DEEP);
  });

  test("scalars pass through at any depth", () => {
    expect(redact("plain")).toBe("plain");
    expect(redact(42)).toBe(42);
    expect(redact(null)).toBe(null);
  });
});

describe("key material by value", () => {
  const secret = generateDhchapSecret({ hash: 1 });
  const psk = "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:";

  test("a DHHC-1 secret or a PSK inside any string is replaced, the text around it kept", () => {
    expect(redactText(`write ${secret} to dhchap_key failed`)).toBe(`write ${REDACTED} to dhchap_key failed`);
    expect(redactText(`psk ${psk}`)).toBe(`psk ${REDACTED}`);
    expect(redact({ detail: [`value ${secret}`] })).toEqual({ detail: [`value ${REDACTED}`] });
    expect(redact(new Error(`bad ${secret}`))).toEqual({ message: `bad ${REDACTED}`, name: "Error" });
  });

  test("a log line never carries the secret, in its message or any field", () => {
    const lines: string[] = [];
    const log = createLogger({ sink: (l) => lines.push(l) }).with({ note: secret });
    log.error(`configfs write of ${secret} failed`, { value: secret, err: new Error(secret) });
    expect(lines).toHaveLength(1);
    expect(lines[0]).not.toContain(secret.slice(10, 40));
    expect(lines[0]).toContain("configfs write of");
  });
});
