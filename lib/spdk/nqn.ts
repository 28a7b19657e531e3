// NVMe Qualified Name syntax as SPDK checks it, so DISTORT can refuse a bad NQN before SPDK answers
// with an error that does not say what was wrong ("Unable to create subsystem …", "Internal error").

/** Prefix of host NQNs derived from a UUID; SPDK requires a real 36-character UUID after it. */
export const UUID_NQN_PREFIX = "nqn.2014-08.org.nvmexpress:uuid:";

/** NVMe limits an NQN to 223 bytes. */
export const MAX_NQN_BYTES = 223;

/** The well-known discovery subsystem NQN, the one NQN without a ":name" part. */
export const DISCOVERY_NQN = "nqn.2014-08.org.nvmexpress.discovery";

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;
// "nqn." + yyyy-mm (digits only; SPDK does not range-check them) + "." + reverse domain + ":" + name.
const DATED = /^nqn\.\d{4}-\d{2}\.([^:]*):(.+)$/s;
const DOMAIN_LABEL = /^[A-Za-z]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$/;

/** True for a canonical 8-4-4-4-12 hexadecimal UUID (either case). */
export function isUuid(s: string): boolean {
  return UUID.test(s);
}

/**
 * Why `nqn` is not a well-formed NQN, or undefined when it is. Pure. Checks what SPDK's own
 * validation checks: length, the `…:uuid:` form with a real UUID, otherwise "nqn." with a yyyy-mm
 * date, a reverse domain whose labels start with a letter, end alphanumeric and hold at most 63
 * characters, and a non-empty name after ":".
 */
export function nqnProblem(nqn: string): string | undefined {
  const bytes = Buffer.byteLength(nqn);
  if (bytes > MAX_NQN_BYTES) return `longer than ${MAX_NQN_BYTES} bytes (${bytes})`;
  if (nqn === DISCOVERY_NQN) return undefined;
  if (nqn.startsWith(UUID_NQN_PREFIX)) {
    const rest = nqn.slice(UUID_NQN_PREFIX.length);
    return isUuid(rest) ? undefined : `"${rest}" after "${UUID_NQN_PREFIX}" is not a UUID`;
  }
  const m = DATED.exec(nqn);
  if (!m) return 'not of the form "nqn.yyyy-mm.reverse.domain:name"';
  const bad = (m[1] as string).split(".").find((l) => !DOMAIN_LABEL.test(l));
  if (bad !== undefined) {
    return `domain label "${bad}" must start with a letter, end with a letter or digit, hold only letters, digits and "-", and be at most 63 characters`;
  }
  return undefined;
}
