// Operator lists that narrow which drives the agent may advertise (NVME_ALLOWED_DEVICES and
// NVME_EXCLUDE_DEVICES in the agent's configuration): each entry is an exact serial or a PCI address.
import { normalizePciAddress } from "../../lib/pci-address.ts";

/** Allowed: when non-empty, only matching drives are advertised. Excluded: never advertised; wins over allowed. */
export interface DeviceFilter {
  readonly allowed?: readonly string[];
  readonly excluded?: readonly string[];
}

/** Why a drive is left out, or undefined when it may be advertised. */
export type FilterVerdict = "Excluded" | "NotAllowed" | undefined;

/**
 * Splits a configuration value into entries: comma-separated, each trimmed, empty ones dropped.
 * A serial containing a comma cannot be listed; name its PCI address instead. Pure.
 */
export function parseDeviceList(value: string | undefined): string[] {
  if (!value) return [];
  return value
    .split(",")
    .map((s) => s.trim())
    .filter((s) => s.length > 0);
}

function matches(entries: readonly string[], device: { serial: string; pciAddress: string }): boolean {
  return entries.some((e) => {
    const entry = e.trim();
    return entry === device.serial || normalizePciAddress(entry) === device.pciAddress;
  });
}

/** Applies `filter` to one drive (serial exact, PCI address in any spelling). Pure. */
export function filterVerdict(
  filter: DeviceFilter,
  device: { serial: string; pciAddress: string },
): FilterVerdict {
  if (filter.excluded && matches(filter.excluded, device)) return "Excluded";
  if (filter.allowed && filter.allowed.length > 0 && !matches(filter.allowed, device)) return "NotAllowed";
  return undefined;
}

/**
 * The verdict for a controller that failed validation, from whatever identity is known. Excluded
 * when a known serial or address is listed. NotAllowed only when both are known and neither is
 * allowed: a drive whose address could not be read might be an allowed one, and calling it "not
 * allowed" would let a scan count as complete and mark an allowed drive absent. Pure.
 */
export function partialFilterVerdict(
  filter: DeviceFilter,
  known: { serial?: string; pciAddress?: string },
): FilterVerdict {
  const serial = known.serial ?? "\u0000no serial";
  const pciAddress = known.pciAddress ?? "\u0000no address";
  if (filter.excluded && matches(filter.excluded, { serial, pciAddress })) return "Excluded";
  if (known.serial === undefined || known.pciAddress === undefined) return undefined;
  return filterVerdict(filter, { serial: known.serial, pciAddress: known.pciAddress });
}
