// classifySpdkError against every error reply captured from SPDK v25.05.1 (each listed with the
// kind it must map to and why), plus the variants other SPDK versions send, and SpdkError's text.

import { describe, expect, test } from "bun:test";
import type { ErrorKind } from "../errors.ts";
import { classifySpdkError, SpdkError } from "./errors.ts";
import { loadTranscript } from "./testing.ts";

/** Every error reply in testdata/spdk-v25.05.1.jsonl, by record seq: expected kind and why. */
const TABLE: Record<number, [ErrorKind, string]> = {
  2: ["precondition", "-1 framework_get_reactors before framework_start_init"],
  6: ["precondition", "-1 framework_get_reactors before framework_start_init"],
  7: ["precondition", "-1 bdev_get_bdevs before framework_start_init"],
  9: ["invalid", "-32602 iobuf_set_options decode failure (string for a count)"],
  10: ["invalid", "-32602 iobuf_set_options decode failure (unknown key)"],
  11: ["unimplemented", "-32601 iobuf_get_options does not exist in v25.05.1"],
  14: ["precondition", "-1 framework_start_init a second time: already initialised"],
  15: ["precondition", "-1 iobuf_set_options after init"],
  21: ["already-exists", "-17 bdev_malloc_create duplicate name"],
  22: ["already-exists", "-17 bdev_malloc_create auto-name collision"],
  24: ["not-found", "-2 bdev_aio_create file missing"],
  27: ["not-found", "-19 bdev_get_bdevs unknown name"],
  29: ["precondition", "-1 bdev_lvol_create_lvstore: base bdev already claimed by that lvstore"],
  30: ["already-exists", "-17 bdev_lvol_create_lvstore lvs name taken"],
  31: ["not-found", "-19 bdev_lvol_create_lvstore base bdev missing"],
  34: ["not-found", "-19 bdev_lvol_get_lvstores unknown lvstore"],
  36: ["already-exists", "-17 bdev_lvol_create duplicate lvol name"],
  38: ["exhausted", '-32602 "No space left on device" thick lvol too big'],
  39: ["invalid", "-22 bdev_lvol_create without lvstore"],
  42: ["not-found", "-19 bdev_lvol_resize unknown lvol"],
  44: ["already-exists", '-32602 "File exists" bdev_lvol_snapshot duplicate'],
  46: ["invalid", '-32602 "Invalid argument" bdev_lvol_clone of a non-snapshot'],
  50: ["already-exists", "-32603 Transport type 'TCP' already exists"],
  51: ["unimplemented", "-32602 Invalid transport type 'RDMA' (not built in)"],
  54: ["already-exists", "-32603 Unable to create subsystem <well-formed NQN>"],
  55: ["invalid", "-32603 Unable to create subsystem not-a-valid-nqn"],
  57: ["already-exists", "-32602 add_ns: same bdev again"],
  58: ["already-exists", "-32602 add_ns: nsid in use"],
  // SPDK's reply to 60 and 61 is byte-for-byte 57's. DISTORT lists the subsystem and its bdev
  // before adding, which rules these causes out; the hint names them for the rare race.
  60: ["already-exists", "-32602 add_ns: bdev missing (indistinguishable from a duplicate)"],
  61: ["already-exists", "-32602 add_ns: subsystem missing (indistinguishable from a duplicate)"],
  63: ["already-exists", "-32602 add_listener duplicate"],
  66: ["invalid", "-32603 add_host with a :uuid: NQN that is not a UUID"],
  67: ["invalid", "-32603 add_host with the same bad :uuid: NQN (it was never added)"],
  68: ["invalid", "-32603 add_host with a :uuid: NQN that is not a UUID"],
  69: ["not-found", "-32603 remove_host of a host not in the list"],
  70: ["not-found", "-32603 remove_host again"],
  73: ["already-exists", "-32603 add_host duplicate (valid UUID NQN)"],
  77: ["not-found", "-32603 remove_host again"],
  78: ["not-found", "-32602 add_host on an unknown subsystem"],
  85: ["precondition", "-5 attach refused: host NQN not allowed"],
  86: ["precondition", "-5 attach refused: default host NQN not allowed"],
  88: ["already-exists", "-114 controller attached twice"],
  89: ["unavailable", "-19 attach: nothing listening on the port"],
  98: ["not-found", "-32602 nvmf_delete_subsystem of an unknown NQN"],
  100: ["not-found", "-19 detach again"],
  113: ["unimplemented", "-32601 unknown method"],
  114: ["unimplemented", "-32601 unknown method with params"],
  122: ["unimplemented", "-32601 unknown method (id-less probe)"],
  123: ["not-found", "-19 bdev_get_bdevs unknown name (id-less probe)"],
  125: ["internal", "-32600 bad jsonrpc version: our envelope would be at fault"],
  126: ["internal", "-32600 jsonrpc as a number"],
  127: ["internal", "-32600 missing method"],
  128: ["internal", "-32600 method not a string"],
  129: ["internal", "-32600 object id"],
  130: ["internal", "-32600 boolean id"],
  131: ["invalid", "-32603 decode failure: params as an array"],
  132: ["internal", "-32600 params as a string"],
  134: ["invalid", "-32602 spdk_get_version with {}"],
  135: ["invalid", "-32602 spdk_get_version with params"],
  136: ["invalid", "-32603 decode failure: unknown key"],
  137: ["invalid", "-32603 decode failure: missing required params"],
  138: ["internal", "-32600 duplicate id key"],
  139: ["internal", "-32600 extra top-level member"],
  140: ["internal", "-32600 batch array"],
  141: ["internal", "-32600 empty batch"],
  142: ["internal", "-32600 top-level scalar"],
  146: ["unimplemented", "-32601 unknown method inside a pipeline"],
  157: ["not-found", "-32602 remove_listener again"],
  161: ["not-found", "-32602 remove_ns again"],
  165: ["not-found", "-32602 nvmf_delete_subsystem again"],
  167: ["precondition", '-32603 "Operation not permitted": snapshot with two clones'],
  169: ["not-found", "-19 bdev_lvol_delete again"],
  173: ["not-found", "-19 bdev_lvol_delete again"],
  175: ["not-found", "-19 bdev_lvol_delete_lvstore again"],
  178: ["not-found", "-19 bdev_malloc_delete again"],
  188: ["precondition", "-1 bdev_lvol_create_lvstore on a bdev exported as a namespace"],
  189: ["precondition", "-1 the same again"],
};

interface Case {
  seq: number;
  method: string;
  code: number;
  message: string;
  params: unknown;
}

/** Every error reply in the transcript, with the method of the request it answers. */
function errorCases(): Case[] {
  const out: Case[] = [];
  for (const r of loadTranscript()) {
    const replies = (Array.isArray(r.response) ? r.response : [r.response]) as Array<{
      error?: { code: number; message: string };
    }>;
    replies.forEach((reply, i) => {
      if (!reply.error) return;
      const method = r.method === "(raw)" ? r.request_methods?.[i] : r.method;
      const params = r.method === "(raw)" ? undefined : (r.request as { params?: unknown }).params;
      out.push({
        seq: r.seq,
        method: typeof method === "string" ? method : "",
        code: reply.error.code,
        message: reply.error.message,
        params,
      });
    });
  }
  return out;
}

const cases = errorCases();

describe("classifySpdkError on every error the transcripts hold", () => {
  test("the table lists exactly the transcript's error replies", () => {
    expect(cases.map((c) => c.seq).sort((a, b) => a - b)).toEqual(
      Object.keys(TABLE)
        .map(Number)
        .sort((a, b) => a - b),
    );
  });

  for (const c of cases) {
    const [kind, why] = TABLE[c.seq] ?? ["internal", "missing from the table"];
    test(`seq ${c.seq} ${c.method || "(no method)"} ${c.code} "${c.message}" -> ${kind} (${why})`, () => {
      expect(classifySpdkError(c.method, c.code, c.message, c.params)).toBe(kind);
    });
  }
});

describe("classifySpdkError on other versions' variants", () => {
  const variants: Array<[string, number, string, ErrorKind]> = [
    // SNAP's SPDK (v23.01) sends some errno codes positive and some messages with a trailing newline.
    ["bdev_nvme_get_controllers", 22, "Controller Nvme9 does not exist\n", "not-found"],
    ["bdev_nvme_attach_controller", -17, "A controller named Nvme0 already exists\n", "already-exists"],
    [
      "bdev_nvme_attach_controller",
      -22,
      "A controller named Nvme0 already exists, but uses a different subnqn (x)",
      "already-exists",
    ],
    [
      "bdev_nvme_attach_controller",
      -114,
      "A controller named Nvme0 already exists and multipath is disabled",
      "already-exists",
    ],
    ["bdev_nvme_detach_controller", -6, "No such device or address", "not-found"],
    // HEAD (v26.09-pre) names the missing subsystem.
    ["nvmf_delete_subsystem", -32602, "Subsystem with NQN 'nqn.2026-02.io.distort:v' not found", "not-found"],
    ["nvmf_subsystem_add_ns", -32602, "Subsystem with NQN 'nqn.2026-02.io.distort:v' not found", "not-found"],
    ["nvmf_subsystem_add_ns", -32602, "Invalid nguid", "invalid"],
    ["nvmf_create_subsystem", -32602, "Invalid parameters", "invalid"],
    // v24.01 and older refuse concurrent state changes of one subsystem.
    ["nvmf_subsystem_add_ns", -32603, "Subsystem currently in another state change try again later.", "busy"],
    ["nvmf_delete_subsystem", -32603, "Subsystem is already being destroyed.", "busy"],
    ["nvmf_subsystem_remove_host", -32603, "Timeout reached during host removal", "timeout"],
    ["bdev_lvol_delete", -16, "Device or resource busy", "busy"],
    ["keyring_file_remove_key", -126, "Required key not available", "not-found"],
    ["keyring_file_add_key", -1, "Operation not permitted", "precondition"],
    ["bdev_get_bdevs", -110, "Connection timed out", "timeout"],
    ["bdev_lvol_resize", -32602, "No space left on device", "exhausted"],
    ["bdev_nvme_attach_controller", -12, "Cannot allocate memory", "exhausted"],
    ["framework_start_init", -32603, "framework_initialization failed", "internal"],
    ["anything", -9999, "Something new", "internal"],
  ];
  for (const [method, code, message, kind] of variants) {
    test(`${method} ${code} ${JSON.stringify(message)} -> ${kind}`, () => {
      expect(classifySpdkError(method, code, message)).toBe(kind);
    });
  }
});

describe("SpdkError", () => {
  test("keeps code, method and SPDK's message verbatim, and is a StorageError of the classified kind", () => {
    const err = new SpdkError("bdev_nvme_attach_controller", -5, "Input/output error");
    expect(err).toMatchObject({
      kind: "precondition",
      code: -5,
      method: "bdev_nvme_attach_controller",
      spdkMessage: "Input/output error",
      details: { method: "bdev_nvme_attach_controller", code: -5, spdkMessage: "Input/output error" },
    });
    expect(err.message).toMatch(
      /^bdev_nvme_attach_controller failed: SPDK error -5 "Input\/output error" \(/,
    );
    expect(err.message).toMatch(/host NQN is not allowed on the subsystem/);
    expect(err.transient).toBe(false);
  });

  test("explains the ambiguous replies", () => {
    expect(new SpdkError("nvmf_subsystem_add_ns", -32602, "Invalid parameters").message).toMatch(
      /duplicate, an unknown subsystem, a missing bdev.*re-read the subsystem/,
    );
    expect(new SpdkError("nvmf_delete_subsystem", -32602, "Invalid parameters").message).toMatch(
      /does not exist/,
    );
    expect(new SpdkError("bdev_nvme_attach_controller", -19, "No such device").message).toMatch(
      /nothing is listening/,
    );
    expect(
      new SpdkError("bdev_nvme_attach_controller", -19, "No such device", {
        params: { name: "nvme_x", trtype: "tcp", traddr: "10.0.0.1", trsvcid: "4420", subnqn: "nqn.x" },
      }).message,
    ).toMatch(/nothing is listening/);
    expect(
      new SpdkError("nvmf_subsystem_add_host", -32603, "Internal error", {
        params: { host: "nqn.2014-08.org.nvmexpress:uuid:allowed-host-0001" },
      }).message,
    ).toMatch(/must end in a real UUID/);
    expect(new SpdkError("nvmf_subsystem_add_host", -32603, "Internal error").message).toMatch(
      /allowed .* already/,
    );
    expect(new SpdkError("bdev_lvol_create", -17, "File exists").message).toBe(
      'bdev_lvol_create failed: SPDK error -17 "File exists"',
    );
  });
});

describe("bdev_nvme_attach_controller -19 over PCIe", () => {
  const pcie = { name: "nvme_s1", trtype: "PCIe", traddr: "0000:5e:00.0" };

  test("is a missing drive, not a fabric target that is down", () => {
    expect(classifySpdkError("bdev_nvme_attach_controller", -19, "No such device", pcie)).toBe("not-found");
    expect(
      classifySpdkError("bdev_nvme_attach_controller", -19, "No such device", { ...pcie, trtype: "pcie" }),
    ).toBe("not-found");
    // Over a fabric it stays what it was: nothing listens there (yet).
    expect(
      classifySpdkError("bdev_nvme_attach_controller", -19, "No such device", {
        trtype: "TCP",
        traddr: "10.0.0.1",
      }),
    ).toBe("unavailable");
  });

  test("says the drive is missing or not bound to SPDK, names the address, and is not transient", () => {
    const err = new SpdkError("bdev_nvme_attach_controller", -19, "No such device", { params: pcie });
    expect(err.message).toMatch(/no NVMe controller was found at PCI address 0000:5e:00\.0/);
    expect(err.message).toMatch(/missing, or not bound to a driver SPDK can use/);
    expect(err.message).toMatch(/No controller was found with provided trid/);
    expect(err.message).not.toMatch(/listening/);
    expect(err.transient).toBe(false);
  });
});
