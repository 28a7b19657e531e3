// NVMe Qualified Names as the kernel target accepts them: the dated reverse-domain form and the
// UUID form of the NVMe base specification, checked before any name becomes a configfs directory.
import { StorageError } from "../../../lib/errors.ts";

/** Longest NQN the NVMe base specification allows, in bytes of UTF-8. */
export const NQN_MAX_BYTES = 223;
/** The well-known discovery subsystem; nvmet refuses it as a configfs subsystem name. */
export const DISCOVERY_NQN = "nqn.2014-08.org.nvmexpress.discovery";
/** Prefix of the UUID form; what follows must be a real 36-character UUID. */
export const UUID_NQN_PREFIX = "nqn.2014-08.org.nvmexpress:uuid:";

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;
// Labels start with a letter and end with a letter or digit (RFC 1035), joined by dots.
const LABEL = "[A-Za-z](?:[A-Za-z0-9-]*[A-Za-z0-9])?";
const DATED = new RegExp(`^nqn\\.(\\d{4})-(\\d{2})\\.${LABEL}(?:\\.${LABEL})*:(.+)$`);
// The part after the colon names a configfs directory, so no slash; whitespace and control
// characters are legal UTF-8 but only ever come from a broken caller.
const BAD_SUFFIX = /[/\s\p{Cc}]/u;

export type NqnRole = "subsystem" | "host";

/**
 * Returns `nqn` unchanged when it is a valid subsystem or host NQN, else throws
 * StorageError("invalid") naming the rule it breaks. Pure; no I/O.
 */
export function validateNqn(nqn: string, role: NqnRole): string {
  const bad = (why: string): never => {
    throw new StorageError("invalid", `${role} NQN ${JSON.stringify(nqn)} ${why}`, {
      details: { nqn, role },
    });
  };
  if (typeof nqn !== "string" || nqn.length === 0) bad("is empty");
  const bytes = new TextEncoder().encode(nqn).length;
  if (bytes > NQN_MAX_BYTES) bad(`is ${bytes} bytes long; the limit is ${NQN_MAX_BYTES}`);
  if (nqn === DISCOVERY_NQN) bad("is the discovery subsystem NQN");
  if (nqn.startsWith(UUID_NQN_PREFIX)) {
    if (!UUID.test(nqn.slice(UUID_NQN_PREFIX.length)))
      bad("has the :uuid: form without a real UUID after it");
    return nqn;
  }
  const m = DATED.exec(nqn);
  if (m === null) bad("is not of the form nqn.YYYY-MM.reverse.domain:name");
  const month = Number((m as RegExpExecArray)[2]);
  if (month < 1 || month > 12) bad("has a month outside 01-12");
  if (BAD_SUFFIX.test((m as RegExpExecArray)[3] as string))
    bad("contains a slash, whitespace or a control character");
  return nqn;
}
