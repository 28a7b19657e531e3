// Table tests for portal address parsing: family detection and service port bounds.
import { expect, test } from "bun:test";
import { addressFamily, serviceId } from "./address.ts";

test.each([
  ["10.0.0.5", "ipv4"],
  ["192.168.100.7", "ipv4"],
  ["fd00::5", "ipv6"],
  ["::1", "ipv6"],
  ["fe80::1%eth0", "ipv6"],
  ["::ffff:10.0.0.5", "ipv6"],
])("%s is %s", (addr, fam) => {
  expect(addressFamily(addr)).toBe(fam as "ipv4" | "ipv6");
});

test.each(["", "storage-0.example", "10.0.0.256", "10.0.0", " 10.0.0.5", "fd00:::5", "10.0.0.5:4420"])(
  "%j is refused as invalid",
  (addr) => {
    expect(() => addressFamily(addr)).toThrow(expect.objectContaining({ kind: "invalid" }));
  },
);

test("service ids are integers in 1-65535", () => {
  expect(serviceId(4420)).toBe("4420");
  expect(serviceId(1)).toBe("1");
  expect(serviceId(65535)).toBe("65535");
  for (const bad of [0, -1, 65536, 4420.5, Number.NaN]) {
    expect(() => serviceId(bad)).toThrow(expect.objectContaining({ kind: "invalid" }));
  }
});
