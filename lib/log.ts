// Structured JSON logging with correlation fields and secret redaction. A Logger is a port: code
// receives one from its constructor and never writes to the console directly.

export type Level = "debug" | "info" | "warn" | "error";
const ORDER: Record<Level, number> = { debug: 10, info: 20, warn: 30, error: 40 };

/** Field names whose values never reach a log line, at any depth. Compared case-insensitively. */
// A bare "key" (a work-queue or cache key) is not secret; "privateKey", "apiKey", "dhchap_key" are.
const SECRET_KEY =
  /secret|passw|token|dhchap|psk|credential|^authorization$|(private|api|access|auth|ssh|tls|dh)[-_]?key$/i;
export const REDACTED = "<redacted>";
/** What an object nested deeper than redact() walks is replaced with: it fails closed. */
export const TOO_DEEP = "<redacted: nested too deep>";
const MAX_DEPTH = 8;
/**
 * Key material recognised by its value wherever it appears (a message, an error text, a field
 * with an innocent name): DH-HMAC-CHAP secrets (DHHC-1:<hash>:<base64>:) and NVMe/TCP PSKs
 * (NVMeTLSkey-1:<hash>:<base64>:).
 */
const SECRET_VALUE = /(DHHC-1|NVMeTLSkey-1):[0-9]{2}:[A-Za-z0-9+/=]*:?/g;

/** `s` with every DH-HMAC-CHAP secret or TLS PSK in it replaced by REDACTED. */
export function redactText(s: string): string {
  return s.replace(SECRET_VALUE, REDACTED);
}

/**
 * Returns a copy of `value` with secret-looking fields replaced, and key material (redactText)
 * removed from every string. Cycles and depth are bounded: an
 * object or array below MAX_DEPTH levels becomes TOO_DEEP, since its fields were never checked.
 */
export function redact(value: unknown, depth = 0): unknown {
  if (typeof value === "string") return redactText(value);
  if (value === null || typeof value !== "object") return value;
  if (depth > MAX_DEPTH) return TOO_DEEP;
  if (Array.isArray(value)) return value.map((v) => redact(v, depth + 1));
  if (value instanceof Error) return { message: redactText(value.message), name: value.name };
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(value)) {
    out[k] = SECRET_KEY.test(k) ? REDACTED : redact(v, depth + 1);
  }
  return out;
}

export interface Logger {
  debug(msg: string, fields?: Record<string, unknown>): void;
  info(msg: string, fields?: Record<string, unknown>): void;
  warn(msg: string, fields?: Record<string, unknown>): void;
  error(msg: string, fields?: Record<string, unknown>): void;
  /** A logger whose lines all carry `fields` (correlation keys such as volume, node, controller). */
  with(fields: Record<string, unknown>): Logger;
}

export type Sink = (line: string) => void;

/** JSON-lines logger. `sink` defaults to stderr so stdout stays free for command output. */
export function createLogger(
  opts: { level?: Level; sink?: Sink; fields?: Record<string, unknown>; now?: () => Date } = {},
): Logger {
  const min = ORDER[opts.level ?? "info"];
  const sink = opts.sink ?? ((line: string) => process.stderr.write(`${line}\n`));
  const now = opts.now ?? (() => new Date());
  const base = opts.fields ?? {};
  const emit = (level: Level, msg: string, fields?: Record<string, unknown>) => {
    if (ORDER[level] < min) return;
    const rec = redact({ ...base, ...fields }) as Record<string, unknown>;
    sink(JSON.stringify({ ts: now().toISOString(), level, msg: redactText(msg), ...rec }));
  };
  return {
    debug: (m, f) => emit("debug", m, f),
    info: (m, f) => emit("info", m, f),
    warn: (m, f) => emit("warn", m, f),
    error: (m, f) => emit("error", m, f),
    with: (fields) => createLogger({ ...opts, fields: { ...base, ...fields } }),
  };
}

/** A logger that drops everything; for tests that do not inspect logs. */
export const silentLogger: Logger = createLogger({ sink: () => {} });
