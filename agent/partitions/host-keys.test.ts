// Which hosts an export admits with which keys: per-host pairs from the volume's key Secret,
// hosts without a pair left out (never admitted unkeyed), a bidirectional volume's host without
// the controller key left out, revocation without reading any Secret, malformed values refused.
import { expect, test } from "bun:test";
import { exampleNVMePartition } from "../../api/examples.ts";
import type { NVMePartition } from "../../api/index.ts";
import { StorageError } from "../../lib/errors.ts";
import { generateHostKeyPair, hostEntryKeys } from "../../lib/nvme/dhchap-keys.ts";
import { generateInterchangePsk } from "../../lib/nvme/tls-psk.ts";
import { keyedAclFor, type SecretReader } from "./host-keys.ts";

const H1 = "nqn.2014-08.org.nvmexpress:uuid:6b4e0f5c-3f3b-4b0e-9d55-0c8f1d2b7a11";
const H2 = "nqn.2014-08.org.nvmexpress:uuid:0d9a77e2-51c4-4c61-8d3e-2b2f0b6f9e40";

function partition(mode: "unidirectional" | "bidirectional"): NVMePartition {
  const p = exampleNVMePartition();
  return {
    ...p,
    metadata: { ...p.metadata, namespace: "distort-system" },
    spec: {
      ...p.spec,
      targetOptions: {
        transport: "tcp",
        dhchap: { mode, hash: "sha256", dhgroup: "null", secretName: "dhchap-pvc-1" },
      },
    },
  } as NVMePartition;
}

/** A SecretReader over one Secret's decoded data, counting reads. */
function reader(data: Record<string, string>): SecretReader & { reads: number } {
  const r = {
    reads: 0,
    async read(ns: string, name: string, key: string) {
      r.reads++;
      return ns === "distort-system" && name === "dhchap-pvc-1" ? data[key] : undefined;
    },
  };
  return r;
}

test("bidirectional: hosts with a full pair are admitted with it; others are left out", async () => {
  const pair = generateHostKeyPair("bidirectional", "sha256");
  const k1 = hostEntryKeys(H1);
  const half = generateHostKeyPair("unidirectional", "sha256");
  const k2 = hostEntryKeys(H2);
  const secrets = reader({
    [k1.secret]: pair.secret,
    [k1.ctrlSecret]: pair.ctrlSecret as string,
    [k2.secret]: half.secret,
  });
  const acl = await keyedAclFor(partition("bidirectional"), [H1, H2], secrets);
  expect(acl.hosts).toEqual([H1]);
  expect(acl.keys?.get(H1)).toEqual({ ...pair, hash: "sha256", dhgroup: "null" });
  expect(acl.keys?.has(H2)).toBe(false);
});

test("unidirectional: the host key alone admits; a host without an entry is left out", async () => {
  const pair = generateHostKeyPair("unidirectional", "sha384");
  const secrets = reader({ [hostEntryKeys(H1).secret]: pair.secret });
  const acl = await keyedAclFor(partition("unidirectional"), [H1, H2], secrets);
  expect(acl.hosts).toEqual([H1]);
  expect(acl.keys?.get(H1)).toEqual({ secret: pair.secret, hash: "sha256", dhgroup: "null" });
});

test("revoking every host reads no Secret, even without a reader", async () => {
  const secrets = reader({});
  expect(await keyedAclFor(partition("bidirectional"), [], secrets)).toEqual({ hosts: [], keys: undefined });
  expect(secrets.reads).toBe(0);
  expect(await keyedAclFor(partition("bidirectional"), [], undefined)).toEqual({
    hosts: [],
    keys: undefined,
  });
});

test("a value that is not a DH-HMAC-CHAP secret is refused, not installed", async () => {
  const secrets = reader({ [hostEntryKeys(H1).secret]: "hunter2" });
  const err = await keyedAclFor(partition("unidirectional"), [H1], secrets).catch((e) => e);
  expect(err).toBeInstanceOf(StorageError);
  expect((err as StorageError).kind).toBe("invalid");
  expect((err as Error).message).not.toContain("hunter2");
});

test("TLS: hosts with a PSK are admitted with it, others left out; a malformed PSK is refused", async () => {
  const p = exampleNVMePartition();
  const tls = {
    ...p,
    metadata: { ...p.metadata, namespace: "distort-system" },
    spec: { ...p.spec, targetOptions: { transport: "tcp", tls: { secretName: "dhchap-pvc-1" } } },
  } as NVMePartition;
  const psk = generateInterchangePsk();
  const acl = await keyedAclFor(tls, [H1, H2], reader({ [hostEntryKeys(H1).psk]: psk }));
  expect(acl.hosts).toEqual([H1]);
  expect(acl.psks?.get(H1)).toBe(psk);
  expect(acl.keys).toBeUndefined();
  const bad = await keyedAclFor(
    tls,
    [H1],
    reader({ [hostEntryKeys(H1).psk]: "NVMeTLSkey-1:01:AAAA:" }),
  ).catch((e) => e);
  expect(bad).toBeInstanceOf(StorageError);
  expect(String(bad)).not.toContain("AAAA");
  // Revoking reads nothing.
  const none = reader({});
  expect(await keyedAclFor(tls, [], none)).toEqual({ hosts: [], keys: undefined });
  expect(none.reads).toBe(0);
});
