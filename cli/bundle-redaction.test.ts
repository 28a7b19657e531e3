import { afterEach, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { redactObject, scrubText, secretValues } from "./bundle-redaction.ts";
import { tarGz } from "./tar-gz.ts";

const dirs: string[] = [];
afterEach(() => {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

test("Secrets keep their keys but no value, last-applied included; managedFields go", () => {
  const secret = {
    apiVersion: "v1",
    kind: "Secret",
    metadata: {
      name: "chap",
      managedFields: [{ manager: "kubectl" }],
      annotations: { "kubectl.kubernetes.io/last-applied-configuration": '{"data":{"key":"c2VjcmV0"}}' },
    },
    data: { key: Buffer.from("secret-value").toString("base64") },
  };
  const out = redactObject(secret) as { data: Record<string, string>; metadata: Record<string, unknown> };
  expect(out.data).toEqual({ key: "<redacted>" });
  expect(out.metadata.managedFields).toBeUndefined();
  expect(JSON.stringify(out)).not.toContain("c2VjcmV0");
  // The source is not modified.
  expect(secret.data.key).not.toBe("<redacted>");
  // Fields whose names say secret are redacted in any object (lib/log.ts's rule).
  expect(redactObject({ kind: "ConfigMap", data: { password: "x", note: "y" } })).toEqual({
    kind: "ConfigMap",
    data: { password: "<redacted>", note: "y" },
  });
});

test("text is scrubbed of known values (raw and base64) and of key-shaped strings", () => {
  const values = secretValues([
    {
      data: {
        p: Buffer.from("hunter2-long\n").toString("base64"),
        short: Buffer.from("ab").toString("base64"),
      },
    },
  ]);
  expect(values).toContain("hunter2-long");
  expect(values).not.toContain("ab");
  const text = [
    "password hunter2-long in a log",
    `base64 ${Buffer.from("hunter2-long\n").toString("base64")}`,
    "key DHHC-1:01:c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0:",
    "psk NVMeTLSkey-1:01:c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0:",
    "Authorization: Bearer abcdefghijklmnopqrstuvwxyz0123",
    "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----",
  ].join("\n");
  expect(scrubText(text, values)).toBe(
    [
      "password <redacted> in a log",
      "base64 <redacted>",
      "key <redacted>",
      "psk <redacted>",
      "Authorization: Bearer <redacted>",
      "<redacted>",
    ].join("\n"),
  );
});

test("tar.gz archives extract with tar, long paths included", () => {
  const dir = mkdtempSync(join(tmpdir(), "kd-tar-"));
  dirs.push(dir);
  const long = `top/${"d".repeat(80)}/${"f".repeat(60)}.log`;
  const archive = join(dir, "a.tar.gz");
  writeFileSync(
    archive,
    tarGz(
      [
        { path: "top/manifest.json", data: "{}\n" },
        { path: long, data: "x".repeat(1000) },
      ],
      1_700_000_000,
    ),
  );
  const r = Bun.spawnSync(["tar", "-xzf", archive, "-C", dir]);
  expect(r.exitCode).toBe(0);
  expect(readFileSync(join(dir, "top/manifest.json"), "utf8")).toBe("{}\n");
  expect(readFileSync(join(dir, long), "utf8")).toBe("x".repeat(1000));
  const list = Bun.spawnSync(["tar", "-tzvf", archive]).stdout.toString();
  expect(list).toContain("2023-11-14");
});
