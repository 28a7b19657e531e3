// The raid1 wrappers of SpdkMethods against the `[1 raid1]` records of SPDK v25.05.1: each
// successful call puts the recorded params on the wire and parses SPDK's real reply bytes
// (including bdev_raid_get_bdevs' repeated "uuid" key); bad params are refused before sending.
import { expect, test } from "bun:test";
import * as v from "valibot";
import type { CallOptions, SpdkRpc } from "./client.ts";
import { SpdkMethods } from "./methods.ts";
import { RaidInfoSchema } from "./schemas.ts";
import { loadTranscript, type TranscriptRecord } from "./testing.ts";

const records = loadTranscript("spdk-v25.05.1-raid1.jsonl");

/** Answers every call with one record's raw reply, as the client would hand it over. */
class ReplayRpc implements SpdkRpc {
  sent: { method: string; params: unknown }[] = [];
  constructor(private readonly rec: TranscriptRecord) {}
  async call(method: string, params?: object, _opts?: CallOptions): Promise<unknown> {
    this.sent.push({ method, params });
    const reply = JSON.parse(this.rec.raw_response) as { result?: unknown; error?: unknown };
    if (reply.error) throw new Error(JSON.stringify(reply.error));
    return reply.result;
  }
  serialize<T>(_key: string, fn: () => Promise<T>): Promise<T> {
    return fn();
  }
}

// biome-ignore lint/suspicious/noExplicitAny: transcript params are untyped JSON.
type Params = any;
const WRAPPERS: Record<string, (m: SpdkMethods, p: Params) => Promise<unknown>> = {
  bdev_raid_create: (m, p) => m.bdevRaidCreate(p),
  bdev_raid_get_bdevs: (m, p) => m.bdevRaidGetBdevs(p.category),
  bdev_raid_delete: (m, p) => m.bdevRaidDelete(p.name),
  bdev_raid_add_base_bdev: (m, p) => m.bdevRaidAddBaseBdev(p.raid_bdev, p.base_bdev),
  bdev_raid_remove_base_bdev: (m, p) => m.bdevRaidRemoveBaseBdev(p.name),
  bdev_raid_set_options: (m, p) => m.bdevRaidSetOptions(p),
};

const ok = records.filter(
  (r) => r.method in WRAPPERS && r.raw_response.includes('"result"') && (r.request as Params).params,
);

test("the transcript has successful calls of every raid wrapper", () => {
  expect(new Set(ok.map((r) => r.method))).toEqual(new Set(Object.keys(WRAPPERS)));
  expect(ok.length).toBeGreaterThan(40);
});

for (const rec of ok) {
  test(`seq ${rec.seq} ${rec.method}: same params on the wire, real reply parses`, async () => {
    const rpc = new ReplayRpc(rec);
    const params = (rec.request as Params).params;
    const out = await (WRAPPERS[rec.method] as (m: SpdkMethods, p: Params) => Promise<unknown>)(
      new SpdkMethods(rpc),
      params,
    );
    expect(rpc.sent).toEqual([{ method: rec.method, params }]);
    if (rec.method === "bdev_raid_get_bdevs") {
      expect(out).toEqual((rec.response as Params).result);
    } else {
      expect(out).toBeUndefined();
    }
  });
}

test("a rebuild's process object and a failed slot decode", async () => {
  const rec = records.find((r) => r.seq === 66) as TranscriptRecord;
  const [r1] = await new SpdkMethods(new ReplayRpc(rec)).bdevRaidGetBdevs("all");
  expect(r1?.process).toEqual({ type: "rebuild", target: "lvsA/l3", progress: { blocks: 512, percent: 3 } });
  const degraded = records.find((r) => r.seq === 54) as TranscriptRecord;
  const [d] = await new SpdkMethods(new ReplayRpc(degraded)).bdevRaidGetBdevs("all");
  expect(d?.base_bdevs_list[1]).toMatchObject({ name: null, is_configured: false });
});

test("bdev_get_bdevs driver_specific.raid decodes with RaidInfoSchema", () => {
  const rec = records.find((r) => r.seq === 33) as TranscriptRecord;
  const [b] = (rec.response as Params).result;
  const info = v.parse(RaidInfoSchema, b.driver_specific.raid);
  expect(info.num_base_bdevs).toBe(2);
});

test("bad params are refused before anything is sent", async () => {
  const rpc = new ReplayRpc(ok[0] as TranscriptRecord);
  const m = new SpdkMethods(rpc);
  await expect(m.bdevRaidCreate({ name: "r", raid_level: "raid1", base_bdevs: ["a"] })).rejects.toThrow(
    /at least 2/,
  );
  // An invalid level on purpose, past the type.
  const raid0 = { name: "r", raid_level: "raid0", base_bdevs: ["a", "b"] } as unknown as Parameters<
    typeof m.bdevRaidCreate
  >[0];
  await expect(m.bdevRaidCreate(raid0)).rejects.toThrow(/raid1 only/);
  await expect(m.bdevRaidSetOptions({ process_window_size_kb: 0 })).rejects.toThrow(/process_window_size_kb/);
  // biome-ignore lint/suspicious/noExplicitAny: an unknown category on purpose.
  await expect(m.bdevRaidGetBdevs("bogus" as any)).rejects.toThrow(/bdev_raid_get_bdevs/);
  expect(rpc.sent).toEqual([]);
});
