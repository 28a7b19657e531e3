// metadata.name of an NVMeDevice: a readable prefix from the node name plus a SHA-256 suffix over
// the exact (node, serial) pair. Serials are arbitrary vendor strings, so they never appear in it.
import { createHash } from "node:crypto";

/** Longest node-derived prefix; with "-" and the suffix the name stays within a DNS label (63). */
export const NAME_PREFIX_MAX = 40;
/** Hex digits of SHA-256 kept: 64 bits, so two drives colliding is not a practical concern. */
export const NAME_HASH_HEX = 16;

/**
 * The NVMeDevice name for the drive with `serial` on `node`: a DNS-1123 label (lower-case
 * alphanumerics and "-", starting and ending alphanumeric, at most 57 characters). Deterministic,
 * so every agent restart finds the object it created; distinct for distinct (node, serial) pairs
 * even when their readable prefixes coincide. Pure.
 */
export function nvmeDeviceName(node: string, serial: string): string {
  const prefix =
    node
      .normalize("NFKD")
      .replace(/\p{M}/gu, "") // "nöde" keeps its o rather than becoming "no-de"
      .toLowerCase()
      .replace(/[^a-z0-9]+/g, "-")
      .replace(/^-+/, "")
      .slice(0, NAME_PREFIX_MAX)
      .replace(/-+$/, "") || "node";
  // JSON keeps the pair unambiguous: no separator can occur in both fields the same way.
  const digest = createHash("sha256")
    .update(JSON.stringify([node, serial]), "utf8")
    .digest("hex");
  return `${prefix}-${digest.slice(0, NAME_HASH_HEX)}`;
}
