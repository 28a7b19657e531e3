// NQN validation as SPDK's nvmf_nqn_is_valid() does it, used for subsystem NQNs and host NQNs:
// the discovery NQN, the `nqn.2014-08.org.nvmexpress:uuid:<uuid>` form with a real UUID, or
// `nqn.yyyy-mm.reverse.domain:user-string`.

/** The well-known discovery subsystem NQN. */
export const DISCOVERY_NQN = "nqn.2014-08.org.nvmexpress.discovery";
const UUID_PREFIX = "nqn.2014-08.org.nvmexpress:uuid:";
const MAX_LEN = 223;
const MIN_LEN = 11;
const MAX_LABEL = 63;
const UUID_RE = /^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$/;

const isAlpha = (c: string) => /^[A-Za-z]$/.test(c);
const isDigit = (c: string) => c >= "0" && c <= "9";

/** True when SPDK accepts `nqn` (byte length 11..223, see the file header for the forms). Pure. */
export function isValidNqn(nqn: string): boolean {
  const len = Buffer.byteLength(nqn, "utf8");
  if (len > MAX_LEN || len < MIN_LEN) return false;
  if (nqn === DISCOVERY_NQN) return true;
  if (nqn.startsWith(UUID_PREFIX)) {
    return UUID_RE.test(nqn.slice(UUID_PREFIX.length));
  }
  if (!nqn.startsWith("nqn.")) return false;
  const date = nqn.slice(4, 12);
  if (!/^\d{4}-\d{2}\.$/.test(date)) return false;
  const colon = nqn.indexOf(":");
  if (colon < 0 || colon >= nqn.length - 1) return false;
  // The reverse domain: labels start with a letter, hold letters, digits and inner hyphens.
  let state: "letter" | "ldh" | "any" = "letter";
  let label = 0;
  for (let i = 12; i < colon; i++) {
    if (label > MAX_LABEL) return false;
    const c = nqn[i] as string;
    if (state === "letter") {
      if (!isAlpha(c)) return false;
      state = "any";
      label++;
    } else if (isAlpha(c) || isDigit(c)) {
      state = "any";
      label++;
    } else if (c === "-") {
      if (i === colon - 1) return false;
      state = "ldh";
      label++;
    } else if (c === "." && state === "any") {
      state = "letter";
      label = 0;
    } else {
      return false;
    }
  }
  // The user string only has to be valid UTF-8, which a JS string from JSON always is.
  return true;
}
