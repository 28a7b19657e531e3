// SpdkMethods against the SPDK v25.05.1 transcripts: for every captured call of a wrapped method,
// the wrapper puts the same request on the wire (id aside) and parses SPDK's real reply bytes;
// plus local refusals, result-shape errors, subsystem serialisation and spdk_kill_instance.

import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { StorageError } from "../errors.ts";
import { silentLogger } from "../log.ts";
import { type CallOptions, SpdkClient, type SpdkRpc } from "./client.ts";
import { SpdkError } from "./errors.ts";
import { JsonObjectStream } from "./json-stream.ts";
import { type ListenerSetAnaStateParams, SpdkMethods, subsystemLockKey } from "./methods.ts";
import { FakeSpdkServer, loadTranscript, type TranscriptRecord, type WireRequest } from "./testing.ts";

const root = await mkdtemp(join(tmpdir(), "distort-spdk-methods-"));
const records = loadTranscript();

let server: FakeSpdkServer;
let client: SpdkClient;
let m: SpdkMethods;
/** What the fake server answers next: SPDK's raw reply bytes with the id rewritten, or nothing. */
let answer: ((req: WireRequest) => string | undefined) | undefined;

beforeAll(async () => {
  server = await FakeSpdkServer.start(root, "spdk.sock", (req, conn) => {
    const text = answer?.(req);
    if (text !== undefined) conn.write(text);
  });
  client = new SpdkClient({ socketPath: server.path, logger: silentLogger });
  m = new SpdkMethods(client);
});
afterAll(async () => {
  await client.close();
  await server.close();
  await rm(root, { recursive: true, force: true });
});

// biome-ignore lint/suspicious/noExplicitAny: transcript params are untyped JSON handed to typed wrappers.
type Params = any;
interface Wrapper {
  call: (m: SpdkMethods, p: Params) => Promise<unknown>;
  /** The wrapper resolves with nothing (SPDK's `true` is checked, not returned). */
  void?: true;
}

/** How to call each wrapper with the arguments equivalent to a transcript request's params. */
const WRAPPERS: Record<string, Wrapper> = {
  spdk_get_version: { call: (m) => m.spdkGetVersion() },
  rpc_get_methods: { call: (m, p) => m.rpcGetMethods(p) },
  framework_get_reactors: { call: (m) => m.frameworkGetReactors() },
  framework_start_init: { call: (m) => m.frameworkStartInit(), void: true },
  framework_wait_init: { call: (m) => m.frameworkWaitInit(), void: true },
  iobuf_set_options: { call: (m, p) => m.iobufSetOptions(p), void: true },
  iobuf_get_options: { call: (m) => m.iobufGetOptions() },
  bdev_get_bdevs: { call: (m, p) => m.bdevGetBdevs(p) },
  bdev_nvme_attach_controller: { call: (m, p) => m.bdevNvmeAttachController(p) },
  bdev_nvme_detach_controller: { call: (m, p) => m.bdevNvmeDetachController(p.name), void: true },
  bdev_nvme_get_controllers: { call: (m, p) => m.bdevNvmeGetControllers(p?.name) },
  bdev_lvol_get_lvstores: { call: (m, p) => m.bdevLvolGetLvstores(p) },
  bdev_lvol_create_lvstore: { call: (m, p) => m.bdevLvolCreateLvstore(p) },
  bdev_lvol_delete_lvstore: { call: (m, p) => m.bdevLvolDeleteLvstore(p), void: true },
  bdev_lvol_create: { call: (m, p) => m.bdevLvolCreate(p) },
  bdev_lvol_delete: { call: (m, p) => m.bdevLvolDelete(p.name), void: true },
  bdev_lvol_resize: { call: (m, p) => m.bdevLvolResize(p.name, p.size_in_mib), void: true },
  bdev_lvol_snapshot: { call: (m, p) => m.bdevLvolSnapshot(p.lvol_name, p.snapshot_name) },
  bdev_lvol_clone: { call: (m, p) => m.bdevLvolClone(p.snapshot_name, p.clone_name) },
  bdev_lvol_get_lvols: { call: (m, p) => m.bdevLvolGetLvols(p) },
  bdev_aio_create: { call: (m, p) => m.bdevAioCreate(p) },
  bdev_aio_delete: { call: (m, p) => m.bdevAioDelete(p.name), void: true },
  nvmf_create_transport: { call: (m, p) => m.nvmfCreateTransport(p), void: true },
  nvmf_get_transports: { call: (m, p) => m.nvmfGetTransports(p?.trtype) },
  nvmf_create_subsystem: { call: (m, p) => m.nvmfCreateSubsystem(p), void: true },
  nvmf_delete_subsystem: { call: (m, p) => m.nvmfDeleteSubsystem(p.nqn), void: true },
  nvmf_get_subsystems: { call: (m, p) => m.nvmfGetSubsystems(p?.nqn) },
  nvmf_subsystem_add_ns: { call: (m, p) => m.nvmfSubsystemAddNs(p) },
  nvmf_subsystem_remove_ns: { call: (m, p) => m.nvmfSubsystemRemoveNs(p.nqn, p.nsid), void: true },
  nvmf_subsystem_add_listener: { call: (m, p) => m.nvmfSubsystemAddListener(p), void: true },
  nvmf_subsystem_remove_listener: { call: (m, p) => m.nvmfSubsystemRemoveListener(p), void: true },
  nvmf_subsystem_get_listeners: { call: (m, p) => m.nvmfSubsystemGetListeners(p.nqn) },
  nvmf_subsystem_add_host: { call: (m, p) => m.nvmfSubsystemAddHost(p), void: true },
  nvmf_subsystem_remove_host: { call: (m, p) => m.nvmfSubsystemRemoveHost(p.nqn, p.host), void: true },
  nvmf_subsystem_allow_any_host: {
    call: (m, p) => m.nvmfSubsystemAllowAnyHost(p.nqn, p.allow_any_host),
    void: true,
  },
  nvmf_subsystem_get_controllers: { call: (m, p) => m.nvmfSubsystemGetControllers(p.nqn) },
  spdk_kill_instance: { call: (m, p) => m.spdkKillInstance(p.sig_name), void: true },
};

/**
 * Transcript calls the wrappers refuse before sending (each is asserted below to fail "invalid"
 * with nothing on the wire), with the reason.
 */
const REFUSED: Record<number, string> = {
  9: 'iobuf_set_options {small_pool_count:"lots"}: a count must be a number',
  10: "iobuf_set_options {bogus_key}: unknown keys are refused (SPDK's decoder fails on them too)",
  39: "bdev_lvol_create without uuid or lvs_name: exactly one lvstore selector is required",
  66: "nvmf_subsystem_add_host with …:uuid:allowed-host-0001: not a real UUID",
  67: "nvmf_subsystem_add_host with …:uuid:allowed-host-0001: not a real UUID",
  68: "nvmf_subsystem_add_host with …:uuid:temp-host-0002: not a real UUID",
  102: "nvmf_subsystem_allow_any_host true: DISTORT never opens a subsystem to any host",
  184: "nvmf_create_transport from rpc.py carries vfio-user-only flags (disable_mappable_bar0, …) the wrapper does not model",
  185: "nvmf_create_subsystem with allow_any_host true: refused (secure by default)",
};

/**
 * Records not replayed here: the 41 raw framing probes (written as exact bytes with string or null
 * ids, malformed envelopes and pipelines; client.test.ts and json-stream.test.ts replay their
 * reply bytes) and the calls of methods DISTORT does not wrap.
 */
const NOT_WRAPPED = [
  "bdev_get_iostat",
  "bdev_malloc_create",
  "bdev_malloc_delete",
  "framework_get_subsystems",
  "iobuf_get_stats",
  "nvmf_get_stats",
  "nvmf_subsystem_get_qpairs",
  "perform_tests",
  "this_method_does_not_exist",
];

const wrapped = records.filter((r) => r.method in WRAPPERS);
const skipped = records.filter((r) => !(r.method in WRAPPERS));

function withoutId(req: unknown): Record<string, unknown> {
  const { id: _id, ...rest } = req as Record<string, unknown>;
  return rest;
}

/** Makes the fake answer the next request with the record's raw reply bytes, id rewritten. */
function answerWith(rec: TranscriptRecord): void {
  const origId = JSON.stringify((rec.request as { id: unknown }).id);
  answer = (req) => {
    const needle = `"id":${origId}`;
    if (!rec.raw_response.includes(needle)) throw new Error(`seq ${rec.seq}: raw reply lacks ${needle}`);
    return rec.raw_response.replace(needle, `"id":${JSON.stringify(req.id)}`);
  };
}

describe("every transcript call of a wrapped method", () => {
  test("the records not replayed are exactly the raw probes and the unwrapped methods", () => {
    expect(skipped.filter((r) => r.method === "(raw)")).toHaveLength(41);
    expect([...new Set(skipped.filter((r) => r.method !== "(raw)").map((r) => r.method))].sort()).toEqual(
      NOT_WRAPPED,
    );
    expect(wrapped).toHaveLength(133);
    expect(wrapped.filter((r) => REFUSED[r.seq] === undefined)).toHaveLength(124);
  });

  for (const rec of wrapped) {
    const params = (rec.request as { params?: unknown }).params;
    const wrapper = WRAPPERS[rec.method] as Wrapper;
    const refused = REFUSED[rec.seq];
    if (refused !== undefined) {
      test(`seq ${rec.seq} ${rec.method}: refused before sending (${refused})`, async () => {
        answer = undefined;
        const before = server.requests.length;
        const err = await wrapper.call(m, params).then(
          () => undefined,
          (e: unknown) => e,
        );
        expect(err).toBeInstanceOf(StorageError);
        expect(err).not.toBeInstanceOf(SpdkError);
        expect((err as StorageError).kind).toBe("invalid");
        expect((err as StorageError).message.startsWith(`${rec.method}: `)).toBe(true);
        expect(server.requests.length).toBe(before);
      });
      continue;
    }
    const response = rec.response as { result?: unknown; error?: { code: number; message: string } };
    test(`seq ${rec.seq} ${rec.method}: same request; ${response.error ? `error ${response.error.code}` : "result parsed"}`, async () => {
      answerWith(rec);
      const before = server.requests.length;
      const outcome = await wrapper.call(m, params).then(
        (value) => ({ value }),
        (error: unknown) => ({ error }),
      );
      expect(server.requests.length).toBe(before + 1);
      const sent = server.requests[before] as WireRequest;
      expect(Number.isSafeInteger(sent.id)).toBe(true);
      expect(withoutId(sent)).toEqual(withoutId(rec.request));

      if (response.error) {
        expect("error" in outcome).toBe(true);
        const err = (outcome as { error: SpdkError }).error;
        expect(err).toBeInstanceOf(SpdkError);
        expect(err.code).toBe(response.error.code);
        expect(err.spdkMessage).toBe(response.error.message);
        expect(err.method).toBe(rec.method);
      } else {
        expect(outcome).toEqual({ value: wrapper.void ? undefined : response.result });
      }
    });
  }
});

describe("the success replies inside the raw framing probes parse too", () => {
  /** [seq, method] of each success reply of a wrapped method in the raw probes. */
  const covered: Array<[number, string]> = [];
  for (const rec of records.filter((r) => r.method === "(raw)")) {
    const requests: WireRequest[] = [];
    try {
      new JsonObjectStream({ maxValueBytes: 1 << 20 }).push(new TextEncoder().encode(rec.raw_request), (v) =>
        requests.push(v as WireRequest),
      );
    } catch {
      continue; // a malformed-request probe: SPDK sent nothing back
    }
    for (const reply of rec.response as Array<{ id: unknown; result?: unknown }>) {
      if (!("result" in reply)) continue;
      // SPDK echoes ids verbatim (1.5e3, -0): compare them as numbers/strings after parsing.
      const req = requests.find((r) => JSON.stringify(r.id) === JSON.stringify(reply.id));
      const wrapper = req && WRAPPERS[req.method as string];
      if (!req || !wrapper) continue;
      covered.push([rec.seq, req.method as string]);
      test(`seq ${rec.seq} ${req.method as string} (id ${JSON.stringify(reply.id)})`, async () => {
        answer = (wire) => `${JSON.stringify({ ...reply, id: wire.id })}\n`;
        const value = await wrapper.call(m, req.params ?? undefined);
        expect(value).toEqual(wrapper.void ? undefined : reply.result);
      });
    }
  }
  test("covers the version, bdev, reactor, lvstore, add_ns, attach, detach and remove_ns replies", () => {
    expect(new Set(covered.map(([, method]) => method))).toEqual(
      new Set([
        "spdk_get_version",
        "bdev_get_bdevs",
        "framework_get_reactors",
        "nvmf_subsystem_allow_any_host",
        "bdev_lvol_get_lvstores",
        "nvmf_subsystem_add_ns",
        "bdev_nvme_attach_controller",
        "bdev_nvme_detach_controller",
        "nvmf_subsystem_remove_ns",
      ]),
    );
  });
});

describe("requests written out by hand (not derived from the transcript params)", () => {
  const cases: Array<[number, () => Promise<unknown>]> = [
    [
      87,
      () =>
        m.bdevNvmeAttachController({
          name: "Nvme0",
          trtype: "tcp",
          adrfam: "ipv4",
          traddr: "127.0.0.1",
          trsvcid: "4420",
          subnqn: "nqn.2016-06.io.spdk:cnode1",
          hostnqn: "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555",
        }),
    ],
    [
      37,
      () => m.bdevLvolCreate({ lvol_name: "thin0", size_in_mib: 32, lvs_name: "lvs0", thin_provision: true }),
    ],
    [
      53,
      () =>
        m.nvmfCreateSubsystem({
          nqn: "nqn.2016-06.io.spdk:cnode1",
          serial_number: "SPDK00000000000001",
          model_number: "SPDK bdev Controller",
          allow_any_host: false,
        }),
    ],
    [
      56,
      () =>
        m.nvmfSubsystemAddNs({ nqn: "nqn.2016-06.io.spdk:cnode1", namespace: { bdev_name: "lvs0/lvol0" } }),
    ],
    [
      62,
      () =>
        m.nvmfSubsystemAddListener({
          nqn: "nqn.2016-06.io.spdk:cnode1",
          listen_address: { trtype: "TCP", adrfam: "IPv4", traddr: "127.0.0.1", trsvcid: "4420" },
        }),
    ],
    [106, () => m.nvmfSubsystemAllowAnyHost("nqn.2016-06.io.spdk:cnode1", false)],
    [160, () => m.nvmfSubsystemRemoveNs("nqn.2016-06.io.spdk:cnode1", 1)],
    [41, () => m.bdevLvolResize("lvs0/lvol0", 24)],
    [1, () => m.spdkGetVersion()],
  ];
  for (const [seq, run] of cases) {
    const rec = records.find((r) => r.seq === seq) as TranscriptRecord;
    test(`seq ${seq} ${rec.method}`, async () => {
      answerWith(rec);
      const before = server.requests.length;
      await run();
      expect(withoutId(server.requests[before])).toEqual(withoutId(rec.request));
    });
  }

  test("attach returns the bdev names, nsid comes back as a number, lvol calls return the bare UUID", async () => {
    answerWith(records[86] as TranscriptRecord);
    expect(
      await m.bdevNvmeAttachController(records[86]?.request && (records[86].request as Params).params),
    ).toEqual(["Nvme0n1", "Nvme0n2"]);
    answerWith(records[55] as TranscriptRecord);
    expect(
      await m.nvmfSubsystemAddNs({
        nqn: "nqn.2016-06.io.spdk:cnode1",
        namespace: { bdev_name: "lvs0/lvol0" },
      }),
    ).toBe(1);
    answerWith(records[34] as TranscriptRecord);
    expect(await m.bdevLvolCreate({ lvol_name: "lvol0", size_in_mib: 16, lvs_name: "lvs0" })).toBe(
      "a2b9eca3-73d0-4826-92fc-14b6e16a3dae",
    );
  });
});

describe("on the wire", () => {
  test("trsvcid goes out as a JSON string; a number is refused with the key named, nothing sent", async () => {
    answer = (req) => `${JSON.stringify({ jsonrpc: "2.0", id: req.id, result: true })}\n`;
    const conn = () => server.connections.at(-1);
    const mark = conn()?.received.length ?? 0;
    await m.nvmfSubsystemAddListener({
      nqn: "nqn.2026-02.io.distort:volume-a",
      listen_address: { trtype: "RDMA", adrfam: "IPv4", traddr: "10.0.0.1", trsvcid: "4420" },
    });
    expect(conn()?.received.slice(mark)).toContain('"trsvcid":"4420"');

    const before = server.requests.length;
    const bad = { name: "n", trtype: "tcp", traddr: "10.0.0.1", trsvcid: 4420 } as unknown as Params;
    const err = await m.bdevNvmeAttachController(bad).catch((e: unknown) => e);
    expect(err).toMatchObject({ kind: "invalid" });
    expect((err as Error).message).toMatch(/^bdev_nvme_attach_controller: trsvcid: must be a string/);
    const err2 = await m
      .nvmfSubsystemAddListener({
        nqn: "nqn.2026-02.io.distort:volume-a",
        listen_address: { trtype: "TCP", traddr: "10.0.0.1", trsvcid: 4420 as unknown as string },
      })
      .catch((e: unknown) => e);
    expect((err2 as Error).message).toMatch(/listen_address\.trsvcid: must be a string/);
    expect(server.requests.length).toBe(before);
  });

  test("local refusals name the method and the offending key", async () => {
    const cases: Array<[() => Promise<unknown>, RegExp]> = [
      [
        () =>
          m.bdevLvolCreate({
            lvol_name: "v",
            size_in_mib: 4,
            lvs_name: "lvs0",
            uuid: "782d72f1-c0a2-49e9-87b0-427b850e7db1",
          }),
        /^bdev_lvol_create: .*exactly one of uuid/,
      ],
      [
        () => m.bdevLvolCreate({ lvol_name: "v", size_in_mib: 0, lvs_name: "lvs0" }),
        /^bdev_lvol_create: size_in_mib:/,
      ],
      [
        () => m.nvmfSubsystemAllowAnyHost("nqn.2026-02.io.distort:v", true as false),
        /never lets a subsystem allow any host/,
      ],
      [
        () => m.keyringFileAddKey({ name: "key0", path: "relative/key" }),
        /^keyring_file_add_key: path: must be an absolute path/,
      ],
      [
        () =>
          m.nvmfSubsystemAddNs({
            nqn: "nqn.2026-02.io.distort:v",
            namespace: { bdev_name: "b", tgt: 1 } as Params,
          }),
        /^nvmf_subsystem_add_ns: namespace\.tgt:/,
      ],
      [
        () => m.nvmfCreateSubsystem({ nqn: "nqn.2026-02.io.distort:v", serial_number: "x".repeat(21) }),
        /serial_number/,
      ],
      [() => m.bdevLvolDeleteLvstore({}), /exactly one of uuid, lvs_name/],
      [() => m.spdkKillInstance("SIGSEGV" as "SIGTERM"), /^spdk_kill_instance: /],
      [() => m.nvmfSubsystemRemoveNs("nqn.2026-02.io.distort:v", 0), /^nvmf_subsystem_remove_ns: /],
    ];
    const before = server.requests.length;
    for (const [run, why] of cases) {
      const err = await run().catch((e: unknown) => e);
      expect(err).toBeInstanceOf(StorageError);
      expect((err as StorageError).kind).toBe("invalid");
      expect((err as StorageError).message).toMatch(why);
    }
    expect(server.requests.length).toBe(before);
  });

  test("keyring and fsdev wrappers (absent from the transcripts) send SPDK's documented shapes", async () => {
    const results: Record<string, unknown> = {
      keyring_file_add_key: true,
      keyring_file_remove_key: true,
      keyring_get_keys: [
        {
          name: "key0",
          module: "keyring_file",
          removed: false,
          probed: false,
          refcnt: 1,
          path: "/etc/keys/k0",
        },
      ],
      fsdev_aio_create: "aio0",
      fsdev_aio_delete: true,
    };
    answer = (req) =>
      `${JSON.stringify({ jsonrpc: "2.0", id: req.id, result: results[req.method as string] })}\n`;
    const before = server.requests.length;
    await m.keyringFileAddKey({ name: "key0", path: "/etc/keys/k0" });
    expect((await m.keyringGetKeys()) as unknown).toEqual(results.keyring_get_keys);
    await m.keyringFileRemoveKey("key0");
    expect(await m.fsdevAioCreate({ name: "aio0", root_path: "/srv/share", enable_xattr: true })).toBe(
      "aio0",
    );
    await m.fsdevAioDelete("aio0");
    expect(server.requests.slice(before).map(withoutId)).toEqual([
      { jsonrpc: "2.0", method: "keyring_file_add_key", params: { name: "key0", path: "/etc/keys/k0" } },
      { jsonrpc: "2.0", method: "keyring_get_keys" },
      { jsonrpc: "2.0", method: "keyring_file_remove_key", params: { name: "key0" } },
      {
        jsonrpc: "2.0",
        method: "fsdev_aio_create",
        params: { name: "aio0", root_path: "/srv/share", enable_xattr: true },
      },
      { jsonrpc: "2.0", method: "fsdev_aio_delete", params: { name: "aio0" } },
    ]);
  });

  test("a reply of the wrong shape is an internal error naming the method and the path", async () => {
    const subsystems = [
      {
        nqn: "nqn.2016-06.io.spdk:cnode1",
        subtype: "NVMe",
        listen_addresses: [],
        allow_any_host: false,
        hosts: [],
        namespaces: [{ nsid: "1", bdev_name: "x" }],
      },
    ];
    answer = (req) =>
      `${JSON.stringify({ jsonrpc: "2.0", id: req.id, result: req.method === "nvmf_get_subsystems" ? subsystems : { uuid: 5 } })}\n`;
    const e1 = await m.nvmfGetSubsystems().catch((e: unknown) => e);
    expect(e1).toMatchObject({ kind: "internal" });
    expect((e1 as Error).message).toMatch(
      /^nvmf_get_subsystems: unexpected reply from SPDK at 0\.namespaces\.0\.nsid: /,
    );
    const e2 = await m
      .bdevLvolCreate({ lvol_name: "v", size_in_mib: 4, lvs_name: "lvs0" })
      .catch((e: unknown) => e);
    expect(e2).toMatchObject({ kind: "internal" });
    expect((e2 as Error).message).toMatch(/^bdev_lvol_create: unexpected reply from SPDK at <result>: /);
    expect(client.connected).toBe(true);
  });

  test("spdk_kill_instance: a connection closed by the exiting target counts as success", async () => {
    const exiting = await FakeSpdkServer.start(root, "exiting.sock", (_req, conn) => conn.destroy());
    const c = new SpdkClient({ socketPath: exiting.path, logger: silentLogger });
    try {
      await new SpdkMethods(c).spdkKillInstance("SIGTERM");
      expect(exiting.requests.map(withoutId)).toEqual([
        { jsonrpc: "2.0", method: "spdk_kill_instance", params: { sig_name: "SIGTERM" } },
      ]);
      // But nothing listening at all is still an error.
      await exiting.close();
      await rm(exiting.path, { force: true });
      const err = await new SpdkMethods(c).spdkKillInstance().catch((e: unknown) => e);
      expect(err).toMatchObject({ kind: "unavailable" });
    } finally {
      await c.close();
    }
  });
});

describe("subsystem serialisation", () => {
  /** A fake SpdkRpc that records, per call, the serialize() key held while it was made. */
  class RecordingRpc implements SpdkRpc {
    readonly calls: Array<{ method: string; key: string | undefined }> = [];
    #held: string | undefined;
    async call(method: string, _params?: object, _opts?: CallOptions): Promise<unknown> {
      this.calls.push({ method, key: this.#held });
      if (method === "nvmf_subsystem_add_ns") return 1;
      if (
        method.startsWith("nvmf_get") ||
        method.endsWith("get_listeners") ||
        method.endsWith("get_controllers")
      )
        return [];
      return true;
    }
    async serialize<T>(key: string, fn: () => Promise<T>): Promise<T> {
      const outer = this.#held;
      this.#held = key;
      try {
        return await fn();
      } finally {
        this.#held = outer;
      }
    }
  }

  test("every mutation of a subsystem runs under subsystemLockKey(nqn); reads do not take the lock", async () => {
    const rpc = new RecordingRpc();
    const w = new SpdkMethods(rpc);
    const nqn = "nqn.2026-02.io.distort:volume-a";
    const la = { trtype: "TCP", adrfam: "IPv4", traddr: "10.0.0.1", trsvcid: "4420" };
    await w.nvmfCreateSubsystem({ nqn });
    await w.nvmfSubsystemAddNs({ nqn, namespace: { bdev_name: "b" } });
    await w.nvmfSubsystemRemoveNs(nqn, 1);
    await w.nvmfSubsystemAddListener({ nqn, listen_address: la });
    await w.nvmfSubsystemRemoveListener({ nqn, listen_address: la });
    await w.nvmfSubsystemAddHost({
      nqn,
      host: "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555",
    });
    await w.nvmfSubsystemSetKeys({
      nqn,
      host: "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555",
      dhchap_key: "k1",
    });
    await w.nvmfSubsystemRemoveHost(
      nqn,
      "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555",
    );
    await w.nvmfSubsystemAllowAnyHost(nqn, false);
    await w.nvmfDeleteSubsystem(nqn);
    await w.nvmfGetSubsystems(nqn);
    await w.nvmfSubsystemGetListeners(nqn);
    await w.nvmfSubsystemGetControllers(nqn);
    const key = subsystemLockKey(nqn);
    expect(key).not.toBe(nqn);
    expect(rpc.calls.slice(0, 10).every((c) => c.key === key)).toBe(true);
    expect(rpc.calls.slice(10).every((c) => c.key === undefined)).toBe(true);
    expect(rpc.calls).toHaveLength(13);
  });

  test("a caller holding serialize(nqn) can call the wrappers inside without deadlock", async () => {
    const nqn = "nqn.2016-06.io.spdk:cnode1";
    answer = (req) =>
      `${JSON.stringify({ jsonrpc: "2.0", id: req.id, result: req.method === "nvmf_subsystem_add_ns" ? 2 : [] })}\n`;
    const nsid = await client.serialize(nqn, async () => {
      await m.nvmfGetSubsystems(nqn);
      return m.nvmfSubsystemAddNs({ nqn, namespace: { bdev_name: "AIO0" } });
    });
    expect(nsid).toBe(2);
  });
});

describe("bdev_set_qos_limit against the QoS capture (testdata/spdk-v25.05.1-qos.jsonl)", () => {
  const qos = loadTranscript("spdk-v25.05.1-qos.jsonl");
  /** Refused before sending: SPDK's reply to these is only "spdk_json_decode_object failed". */
  const LOCAL: Record<number, string> = {
    172: "a fractional MB/s",
    176: "no limit at all (SPDK: -22)",
    178: "a negative limit",
    179: "a limit sent as a string",
  };
  for (const rec of qos.filter((r) => r.method === "bdev_set_qos_limit")) {
    const params = (rec.request as { params: Params }).params;
    const response = rec.response as { error?: { code: number; message: string } };
    if (LOCAL[rec.seq] !== undefined) {
      test(`seq ${rec.seq}: ${LOCAL[rec.seq]} is refused as invalid with nothing sent`, async () => {
        answer = undefined;
        const before = server.requests.length;
        const err = await m.bdevSetQosLimit(params).then(
          () => undefined,
          (e: unknown) => e,
        );
        expect((err as StorageError).kind).toBe("invalid");
        expect(server.requests.length).toBe(before);
      });
      continue;
    }
    test(`seq ${rec.seq}: same request; ${response.error ? `error ${response.error.code}` : "true"}`, async () => {
      answerWith(rec);
      const before = server.requests.length;
      const outcome = await m.bdevSetQosLimit(params).then(
        () => ({ ok: true }),
        (error: unknown) => ({ error }),
      );
      expect(withoutId(server.requests[before] as WireRequest)).toEqual(withoutId(rec.request));
      if (response.error) expect((outcome as { error: SpdkError }).error.code).toBe(response.error.code);
      else expect(outcome).toEqual({ ok: true });
    });
  }
  test("bdev_get_bdevs replies carry the assigned limits", async () => {
    const rec = qos.find((r) => r.seq === 175) as TranscriptRecord;
    answerWith(rec);
    const [b] = await m.bdevGetBdevs({ name: "m0" });
    expect(b?.assigned_rate_limits).toEqual({
      rw_ios_per_sec: 1000,
      rw_mbytes_per_sec: 100,
      r_mbytes_per_sec: 50,
      w_mbytes_per_sec: 20,
    });
  });
});

describe("multipath listeners and ANA against the capture (testdata/spdk-v25.05.1-ana.jsonl)", () => {
  const ana = loadTranscript("spdk-v25.05.1-ana.jsonl").filter((r) => r.app.startsWith("nvmf_tgt(T)"));
  /** States SPDK refuses with only "Invalid parameters": refused here before sending. */
  const LOCAL = new Set(["bogus", "persistent_loss", "change"]);
  for (const rec of ana.filter((r) => r.method === "nvmf_subsystem_listener_set_ana_state")) {
    const params = (rec.request as { params: Params }).params as ListenerSetAnaStateParams;
    const response = rec.response as { error?: { code: number; message: string } };
    if (LOCAL.has(String(params.ana_state))) {
      test(`seq ${rec.seq}: ana_state ${params.ana_state} is refused as invalid with nothing sent`, async () => {
        answer = undefined;
        const before = server.requests.length;
        const err = await m.nvmfSubsystemListenerSetAnaState(params).then(
          () => undefined,
          (e: unknown) => e,
        );
        expect((err as StorageError).kind).toBe("invalid");
        expect(server.requests.length).toBe(before);
      });
      continue;
    }
    test(`seq ${rec.seq}: same request; ${response.error ? `error ${response.error.code}` : "true"}`, async () => {
      answerWith(rec);
      const before = server.requests.length;
      const outcome = await m.nvmfSubsystemListenerSetAnaState(params).then(
        () => ({ ok: true }),
        (error: unknown) => ({ error }),
      );
      expect(withoutId(server.requests[before] as WireRequest)).toEqual(withoutId(rec.request));
      if (response.error) expect((outcome as { error: SpdkError }).error.code).toBe(response.error.code);
      else expect(outcome).toEqual({ ok: true });
    });
  }
  test("get_listeners replies: ana_states per group with ana_reporting, none without", async () => {
    answerWith(ana.find((r) => r.seq === 122) as TranscriptRecord);
    const withAna = await m.nvmfSubsystemGetListeners("nqn.2016-06.io.spdk:mp");
    expect(withAna.map((l) => l.address.traddr)).toEqual(["127.0.0.211", "127.0.0.210"]);
    expect(withAna[0]?.ana_states?.length).toBe(32);
    expect(withAna[0]?.ana_states?.[0]).toEqual({ ana_group: 1, ana_state: "non_optimized" });
    answerWith(ana.find((r) => r.seq === 135) as TranscriptRecord);
    const [plain] = await m.nvmfSubsystemGetListeners("nqn.2016-06.io.spdk:no-ana");
    expect(plain?.ana_states).toBeUndefined();
  });
});

describe("shallow copy against the lvol delta capture (testdata/spdk-v25.05.1-lvol-delta.jsonl)", () => {
  const delta = loadTranscript("spdk-v25.05.1-lvol-delta.jsonl");
  const calls = delta.filter(
    (r) => r.method === "bdev_lvol_start_shallow_copy" || r.method === "bdev_lvol_check_shallow_copy",
  );
  /** The kind each recorded error reply maps to, by seq. */
  const KINDS: Record<number, string> = {
    378: "not-found", // -19: the terminal state was reported already
    381: "not-found", // -19: unknown source
    382: "not-found", // -32602 "No such device": unknown destination
    383: "not-found", // -19: unknown operation id
    387: "not-found", // -19: checked again after "complete"
  };
  const callOf = (rec: TranscriptRecord) => {
    const p = (rec.request as { params: Params }).params;
    return rec.method === "bdev_lvol_start_shallow_copy"
      ? m.lvolStartShallowCopy(p)
      : m.lvolCheckShallowCopy(p.operation_id);
  };

  test("the capture has the starts and checks of section 6, errors among them", () => {
    expect(calls).toHaveLength(25);
    expect(calls.filter((r) => (r.response as { error?: unknown }).error).map((r) => r.seq)).toEqual(
      Object.keys(KINDS).map(Number),
    );
  });

  for (const rec of calls) {
    const response = rec.response as { result?: unknown; error?: { code: number; message: string } };
    test(`seq ${rec.seq} ${rec.method}: same request; ${response.error ? `error ${response.error.code} → ${KINDS[rec.seq]}` : JSON.stringify(response.result)}`, async () => {
      answerWith(rec);
      const before = server.requests.length;
      const outcome = await callOf(rec).then(
        (value) => ({ value }),
        (error: unknown) => ({ error }),
      );
      expect(withoutId(server.requests[before] as WireRequest)).toEqual(withoutId(rec.request));
      if (response.error) {
        const err = (outcome as { error: SpdkError }).error;
        expect(err).toBeInstanceOf(SpdkError);
        expect(err.code).toBe(response.error.code);
        expect(err.spdkMessage).toBe(response.error.message);
        expect(err.kind).toBe(KINDS[rec.seq] as StorageError["kind"]);
      } else {
        expect(outcome as unknown).toEqual({ value: response.result });
      }
    });
  }

  test("the asynchronous failures come back as state error with SPDK's text", async () => {
    answerWith(delta.find((r) => r.seq === 377) as TranscriptRecord);
    expect(await m.lvolCheckShallowCopy(1)).toEqual({
      copied_clusters: 0,
      total_clusters: 0,
      state: "error",
      error: "Operation not permitted",
    });
    answerWith(delta.find((r) => r.seq === 380) as TranscriptRecord);
    const small = await m.lvolCheckShallowCopy(2);
    expect(small.state).toBe("error");
    expect(small.error).toBe("Invalid argument");
  });

  test("a destination claimed by something else is precondition (-32602 Operation not permitted)", async () => {
    answer = (req) =>
      `{"jsonrpc":"2.0","id":${req.id},"error":{"code":-32602,"message":"Operation not permitted"}}\n`;
    const err = await m.lvolStartShallowCopy({ src_lvol_name: "lvs/snap", dst_bdev_name: "aio0" }).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(SpdkError);
    expect((err as SpdkError).kind).toBe("precondition");
  });

  test("a state the schema does not know is refused as internal, naming it", async () => {
    answer = (req) =>
      `{"jsonrpc":"2.0","id":${req.id},"result":{"copied_clusters":1,"total_clusters":2,"state":"paused"}}\n`;
    const err = await m.lvolCheckShallowCopy(7).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(StorageError);
    expect(err).not.toBeInstanceOf(SpdkError);
    expect((err as StorageError).kind).toBe("internal");
    expect((err as StorageError).message).toContain("bdev_lvol_check_shallow_copy");
    expect((err as StorageError).message).toContain('"paused"');
  });

  test("a start reply without an operation id is refused as internal", async () => {
    answer = (req) => `{"jsonrpc":"2.0","id":${req.id},"result":true}\n`;
    const err = await m.lvolStartShallowCopy({ src_lvol_name: "lvs/snap", dst_bdev_name: "aio0" }).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect((err as StorageError).kind).toBe("internal");
  });

  test("bad params are refused as invalid with nothing sent", async () => {
    answer = undefined;
    const before = server.requests.length;
    const bad: (() => Promise<unknown>)[] = [
      () => m.lvolCheckShallowCopy(-1),
      () => m.lvolCheckShallowCopy(1.5),
      () => m.lvolCheckShallowCopy(2 ** 32),
      () => m.lvolStartShallowCopy({ src_lvol_name: "", dst_bdev_name: "dst" }),
      () => m.lvolStartShallowCopy({ src_lvol_name: "lvs/snap", dst_bdev_name: "" }),
      () => m.lvolStartShallowCopy({ src_lvol_name: "lvs/snap", dst_bdev_name: "dst", extra: 1 } as Params),
    ];
    for (const call of bad) {
      const err = await call().then(
        () => undefined,
        (e: unknown) => e,
      );
      expect((err as StorageError).kind).toBe("invalid");
      expect((err as StorageError).message).toMatch(/^bdev_lvol_(start|check)_shallow_copy: /);
    }
    expect(server.requests.length).toBe(before);
  });
});
