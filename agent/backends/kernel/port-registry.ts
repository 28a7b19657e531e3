// Deterministic nvmet port ids: one configfs port per listener (transport, family, address,
// service), shared by every subsystem exported on it, so repeated calls never create a second.
import { StorageError } from "../../../lib/errors.ts";
import type { AddressFamily } from "./address.ts";

/** What a port listens on, as written to its addr_* attributes. */
export interface Listener {
  trtype: string;
  adrfam: AddressFamily;
  traddr: string;
  trsvcid: string;
}

/** A port as read back from configfs; attributes nvmet shows empty are "". */
export interface ObservedPort {
  id: number;
  trtype: string;
  adrfam: string;
  traddr: string;
  trsvcid: string;
  /** Number of subsystems linked into ports/<id>/subsystems; > 0 means the port is enabled. */
  links: number;
}

/**
 * - reuse: a port with exactly this listener exists; write nothing.
 * - adopt: a disabled port whose addr_* attributes are incomplete (what a crash between mkdir and the
 *   attribute writes leaves behind); write the attributes.
 * - create: mkdir ports/<id> (the lowest id not in use) and write the attributes.
 */
export interface PortChoice {
  id: number;
  action: "reuse" | "adopt" | "create";
}

/** nvmet parses port directory names as u16; 0 is left alone (nvmetcli never uses it either). */
export const MAX_PORT_ID = 65535;

export function sameListener(p: ObservedPort, want: Listener): boolean {
  return (
    p.trtype === want.trtype &&
    p.adrfam === want.adrfam &&
    p.traddr === want.traddr &&
    p.trsvcid === want.trsvcid
  );
}

/**
 * Picks the port for `want`. Pure and deterministic: the same observed ports always give the same
 * answer, so two agents (or one agent after a restart) agree. Lowest id wins every tie. Throws
 * StorageError("exhausted") when every id is taken.
 */
export function choosePort(ports: readonly ObservedPort[], want: Listener): PortChoice {
  const byId = [...ports].sort((a, b) => a.id - b.id);
  const same = byId.find((p) => sameListener(p, want));
  if (same) return { id: same.id, action: "reuse" };
  const incomplete = byId.find((p) => p.links === 0 && (!p.trtype || !p.adrfam || !p.traddr || !p.trsvcid));
  if (incomplete) return { id: incomplete.id, action: "adopt" };
  const used = new Set(byId.map((p) => p.id));
  for (let id = 1; id <= MAX_PORT_ID; id++) {
    if (!used.has(id)) return { id, action: "create" };
  }
  throw new StorageError("exhausted", "every nvmet port id is in use");
}
