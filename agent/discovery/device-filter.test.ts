// NVME_ALLOWED_DEVICES / NVME_EXCLUDE_DEVICES semantics: serial or PCI address, exclusion wins.
import { expect, test } from "bun:test";
import { type DeviceFilter, filterVerdict, parseDeviceList, partialFilterVerdict } from "./device-filter.ts";

const drive = { serial: "S4EW NX0R", pciAddress: "0000:3b:00.0" };

test.each<[string, DeviceFilter, ReturnType<typeof filterVerdict>]>([
  ["no lists", {}, undefined],
  ["empty allowed list allows all", { allowed: [] }, undefined],
  ["allowed by serial", { allowed: ["S4EW NX0R"] }, undefined],
  ["allowed by PCI address in another spelling", { allowed: ["3B:00.0"] }, undefined],
  ["not in allowed list", { allowed: ["OTHER", "0000:5e:00.0"] }, "NotAllowed"],
  ["serial match is exact (case)", { allowed: ["s4ew nx0r"] }, "NotAllowed"],
  ["excluded by serial", { excluded: ["S4EW NX0R"] }, "Excluded"],
  ["excluded by PCI address", { excluded: ["0000:3b:00.0"] }, "Excluded"],
  ["exclusion wins over allowance", { allowed: ["S4EW NX0R"], excluded: ["0000:3b:00.0"] }, "Excluded"],
  ["other exclusions do not matter", { excluded: ["0000:3b:00.1", "S4EW"] }, undefined],
])("%s", (_name, filter, want) => {
  expect(filterVerdict(filter, drive)).toBe(want);
});

test.each<[string | undefined, string[]]>([
  [undefined, []],
  ["", []],
  ["S1", ["S1"]],
  [" S1 , 0000:3b:00.0,,S 2 ", ["S1", "0000:3b:00.0", "S 2"]],
])("parseDeviceList(%p)", (value, want) => {
  expect(parseDeviceList(value)).toEqual(want);
});

test.each<[string, DeviceFilter, { serial?: string; pciAddress?: string }, ReturnType<typeof filterVerdict>]>(
  [
    [
      "excluded by its known address",
      { excluded: ["0000:3b:00.0"] },
      { pciAddress: "0000:3b:00.0" },
      "Excluded",
    ],
    ["excluded by its known serial", { excluded: ["S1"] }, { serial: "S1" }, "Excluded"],
    ["nothing known: stays a problem", { excluded: ["S1"], allowed: ["S2"] }, {}, undefined],
    // Its serial might be an allowed one; claiming "not allowed" would make a scan complete wrongly.
    [
      "only address known, not in allowed list: stays a problem",
      { allowed: ["S2"] },
      { pciAddress: "0000:3b:00.0" },
      undefined,
    ],
    [
      "both known, neither allowed",
      { allowed: ["S2"] },
      { serial: "S1", pciAddress: "0000:3b:00.0" },
      "NotAllowed",
    ],
    ["both known, allowed", { allowed: ["S1"] }, { serial: "S1", pciAddress: "0000:3b:00.0" }, undefined],
  ],
)("a controller that failed validation: %s", (_name, filter, known, want) => {
  expect(partialFilterVerdict(filter, known)).toBe(want);
});
