// PCI addresses as DISTORT stores them: lower-case, zero-padded domain:bus:device.function, the
// form sysfs and SPDK print (0000:3b:00.0), so that both sources compare equal. Used by the agent's
// discovery and by the SPDK emulator for PCIe transport addresses.

// Domain up to 8 hex digits (Intel VMD uses 10000+), bus 8 bits, device 5 bits, function 3 bits.
const BDF = /^(?:([0-9a-f]{1,8}):)?([0-9a-f]{1,2}):([0-9a-f]{1,2})\.([0-7])$/;

/**
 * The normalized form of `raw` (surrounding whitespace ignored, case-insensitive, a missing domain
 * read as 0000), or undefined when it is not a PCI address. Pure.
 */
export function normalizePciAddress(raw: string): string | undefined {
  const m = BDF.exec(raw.trim().toLowerCase());
  if (!m) return undefined;
  const [, domain = "0", bus = "", dev = "", fn = ""] = m;
  if (Number.parseInt(dev, 16) > 0x1f) return undefined;
  return `${domain.padStart(4, "0")}:${bus.padStart(2, "0")}:${dev.padStart(2, "0")}.${fn}`;
}
