// What keeps secrets out of a support bundle: Secret objects keep their keys but lose their
// values, every object goes through lib/log.ts's field-name redaction, and every file's text has
// each known Secret value (raw and base64) and anything key-shaped (DH-HMAC-CHAP and TLS PSK
// interchange keys, PEM private keys, bearer tokens) replaced.
import { REDACTED, redact } from "../lib/log.ts";

const LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration";

/** Key-shaped strings, whatever field or log line they appear in. */
const KEY_PATTERNS: readonly RegExp[] = [
  /DHHC-1:[0-9a-fA-F]{2}:[A-Za-z0-9+/=]+:?/g,
  /NVMeTLSkey-1:[0-9a-fA-F]{2}:[A-Za-z0-9+/=]+:?/g,
  /-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----/g,
  /\beyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}/g,
  /(Bearer\s+)[A-Za-z0-9._~+/-]{16,}=*/g,
];

/** Every value of `secrets` (data decoded and as stored, stringData), for scrubText. Pure. */
export function secretValues(
  secrets: readonly { data?: Record<string, string>; stringData?: Record<string, string> }[],
): string[] {
  const out = new Set<string>();
  for (const s of secrets) {
    for (const b64 of Object.values(s.data ?? {})) {
      out.add(b64);
      const raw = Buffer.from(b64, "base64").toString("utf8");
      out.add(raw);
      out.add(raw.trim());
    }
    for (const v of Object.values(s.stringData ?? {})) out.add(v);
  }
  // Very short values would redact ordinary words; values under 6 bytes are kept out of the scan
  // (they are still removed from the Secret objects themselves).
  return [...out].filter((v) => v.length >= 6).sort((a, b) => b.length - a.length);
}

/** A copy of a Secret without its values (keys kept, so "is key X there" stays answerable). Pure. */
export function redactSecret(secret: Record<string, unknown>): Record<string, unknown> {
  const s = structuredClone(secret) as {
    data?: Record<string, string>;
    stringData?: Record<string, string>;
    metadata?: { annotations?: Record<string, string> };
  };
  for (const field of ["data", "stringData"] as const) {
    const d = s[field];
    if (d) for (const k of Object.keys(d)) d[k] = REDACTED;
  }
  if (s.metadata?.annotations?.[LAST_APPLIED]) s.metadata.annotations[LAST_APPLIED] = REDACTED;
  return s as Record<string, unknown>;
}

/** An object for the bundle: Secrets emptied, managedFields dropped, secret-named fields redacted. Pure. */
export function redactObject(obj: Record<string, unknown>): Record<string, unknown> {
  const meta = obj.metadata as Record<string, unknown> | undefined;
  let o = obj;
  if (meta && "managedFields" in meta) {
    const { managedFields: _, ...rest } = meta;
    o = { ...obj, metadata: rest };
  }
  if (o.kind === "Secret") o = redactSecret(o);
  return redact(o) as Record<string, unknown>;
}

/** `text` with every known value and key-shaped string replaced by REDACTED. Pure. */
export function scrubText(text: string, values: readonly string[]): string {
  let t = text;
  for (const v of values) if (t.includes(v)) t = t.split(v).join(REDACTED);
  for (const re of KEY_PATTERNS)
    t = t.replace(re, (m, bearer?: string) =>
      typeof bearer === "string" && m.startsWith(bearer) ? `${bearer}${REDACTED}` : REDACTED,
    );
  return t;
}
