// Request-body logging rules: every field the CSI spec marks csi_secret is redacted by name, and
// truncation happens after redaction.

import { describe, expect, test } from "bun:test";
import { create, type DescMessage, getOption } from "@bufbuild/protobuf";
import { CreateVolumeRequestSchema, csi_secret, file_csi_v1_csi } from "../../gen/csi/v1/csi_pb";
import { REDACTED, redact } from "../log";
import { loggableBody } from "./instrument";

describe("loggableBody", () => {
  test("every csi_secret field of the vendored CSI spec is redacted by lib/log's key rule", () => {
    const all = (ms: readonly DescMessage[]): DescMessage[] =>
      ms.flatMap((m) => [m, ...all(m.nestedMessages)]);
    const secretFields: string[] = [];
    for (const t of all(file_csi_v1_csi.messages)) {
      for (const f of t.fields) {
        if (!getOption(f, csi_secret)) continue;
        secretFields.push(`${t.typeName}.${f.name}`);
        // Logged bodies are proto JSON, so the key a log line would carry is the JSON name.
        expect(redact({ [f.jsonName]: { k: "v" } })).toEqual({ [f.jsonName]: REDACTED });
      }
    }
    // A guard against the walk silently finding nothing (CSI v1.13.0 marks 22 fields).
    expect(secretFields.length).toBeGreaterThanOrEqual(20);
  });

  test("redacts before cutting long bodies", () => {
    const req = create(CreateVolumeRequestSchema, {
      name: "pvc-1",
      secrets: { password: "hunter2" },
      parameters: { big: "y".repeat(5000) },
    });
    const out = loggableBody(CreateVolumeRequestSchema, req, 100);
    expect(typeof out).toBe("string");
    expect(out as string).toHaveLength(100 + "...(5068 chars)".length);
    expect(out as string).not.toContain("hunter2");
    expect(loggableBody(CreateVolumeRequestSchema, req, 10_000)).toMatchObject({
      secrets: REDACTED,
      name: "pvc-1",
    });
  });
});
