// The lab initiator against a real emulated target on a SimFabric, with losetup scripted: the
// target's ACL refuses unknown hosts (and nothing is attached), an allowed host gets a loop device
// over the namespace's file, connections survive an initiator restart, a host removed from the ACL
// shows as reconnecting, and disconnect detaches.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ScriptedExec } from "../../../csi/host/scripted-exec.ts";
import { ManualClock } from "../../../lib/clock.ts";
import { spdkRpcBackingResolver } from "./namespace-backing.ts";
import { SimNvmeInitiator } from "./sim-initiator.ts";
import { startTestTarget, type TestTarget } from "./test-target.ts";

const MIB = 1024 * 1024;
const HOST = "nqn.2014-08.org.nvmexpress:uuid:cb39fbf1-e515-48f8-830b-34f0b60eceb0";
const OTHER = "nqn.2014-08.org.nvmexpress:uuid:00000000-1111-2222-3333-444444444444";
const NQN = "nqn.2026-01.io.distort:vol-lab-1";
const UUID = "7f0e2a44-1b6c-4d2e-9a51-0c3b8d9e6f12";
const spec = {
  nqn: NQN,
  sizeBytes: 16 * MIB,
  hosts: [HOST],
  uuid: UUID,
  traddr: "10.1.0.7",
  trsvcid: "4420",
};

let target: TestTarget;
let file: string;
let stateDir: string;

/** losetup as a table of attached devices. */
function fakeLosetup() {
  const attached = new Map<string, { file: string; offset: number; sizelimit: number }>();
  let next = 7;
  const exec = new ScriptedExec()
    .on(["losetup", "--list"], () => ({
      stdout: JSON.stringify({
        loopdevices: [...attached].map(([name, a]) => ({
          name,
          "back-file": a.file,
          ro: false,
          offset: a.offset,
          sizelimit: a.sizelimit,
        })),
      }),
    }))
    .on(["losetup", "--find"], (argv) => {
      const name = `/dev/loop${next++}`;
      attached.set(name, { file: argv.at(-1) as string, offset: 0, sizelimit: 0 });
      return { stdout: `${name}\n` };
    })
    .on(["losetup", "--detach"], (argv) => {
      attached.delete(argv[2] as string);
      return {};
    });
  return { exec, attached };
}

beforeAll(async () => {
  target = await startTestTarget();
  file = await target.exportFile(spec);
  stateDir = mkdtempSync(join(tmpdir(), "sim-init-"));
});
afterAll(async () => {
  await target.close();
  rmSync(stateDir, { recursive: true, force: true });
});

const params = (hostNqn = HOST) => ({
  transport: "tcp" as const,
  address: "10.1.0.7",
  port: 4420,
  nqn: NQN,
  hostNqn,
});

test("a host the ACL does not allow is refused, and nothing is attached", async () => {
  const { exec } = fakeLosetup();
  const init = new SimNvmeInitiator({
    fabric: target.fabric,
    stateDir,
    exec,
    backing: spdkRpcBackingResolver(target.rpc),
  });
  const err = await init.connect(params(OTHER)).catch((e) => e);
  expect(err.kind).toBe("unavailable");
  expect(err.message).toContain(`host ${OTHER} not allowed`);
  expect(exec.calls).toEqual([]);
  expect(await init.list()).toEqual([]);
  expect(target.emulator.state().subsystems.find((s) => s.nqn === NQN)?.controllers).toEqual([]);
  // Nothing listens on another port: refused as well.
  expect((await init.connect({ ...params(), port: 4999 }).catch((e) => e)).kind).toBe("unavailable");
});

test("connect, restart, host removal, reconnect, disconnect", async () => {
  const { exec, attached } = fakeLosetup();
  const clock = new ManualClock(1_000_000);
  const make = () =>
    new SimNvmeInitiator({
      fabric: target.fabric,
      stateDir,
      exec,
      backing: spdkRpcBackingResolver(target.rpc),
      clock,
    });
  const init = make();
  await init.connect({ ...params(), reconnectDelay: 2 });
  // The whole file is the namespace: no offset, no size limit, so the device can follow growth.
  expect(exec.argvOf("losetup").filter((a) => a[1] === "--find")).toEqual([
    ["losetup", "--find", "--show", file],
  ]);
  expect([...attached.keys()]).toEqual(["/dev/loop7"]);
  expect(
    target.emulator
      .state()
      .subsystems.find((s) => s.nqn === NQN)
      ?.controllers.map((c) => c.hostnqn),
  ).toEqual([HOST]);
  expect(await init.list()).toEqual([
    {
      nqn: NQN,
      hostNqn: HOST,
      name: "nvme-subsys0",
      paths: [{ name: "nvme0", transport: "tcp", traddr: "10.1.0.7", trsvcid: "4420", state: "live" }],
    },
  ]);
  expect(await init.findNamespaceDevice(NQN, UUID)).toBe("/dev/loop7");
  expect(await init.findNamespaceDevice(NQN, UUID.replaceAll("-", "").toUpperCase())).toBe("/dev/loop7");
  expect(await init.findNamespaceDevice(NQN)).toBe("/dev/loop7");
  expect(await init.findNamespaceDevice(NQN, "00000000-0000-0000-0000-000000000000")).toBeUndefined();

  // Connecting again is a no-op.
  await init.connect({ ...params(), reconnectDelay: 2 });
  expect(exec.argvOf("losetup").filter((a) => a[1] === "--find")).toHaveLength(1);

  // A restarted node process finds its connection and its loop device, and re-dials the target.
  init.close();
  const again = make();
  expect((await again.list())[0]?.paths[0]?.state).toBe("live");
  expect(await again.findNamespaceDevice(NQN, UUID)).toBe("/dev/loop7");
  await again.connect({ ...params(), reconnectDelay: 2 });
  expect(exec.argvOf("losetup").filter((a) => a[1] === "--find")).toHaveLength(1);

  // The target drops the host: the link goes, the device stays, the path reconnects in vain.
  await target.rpc.call("nvmf_subsystem_remove_host", { nqn: NQN, host: HOST });
  await Bun.sleep(20);
  expect((await again.list())[0]?.paths[0]?.state).toBe("connecting");
  expect(await again.findNamespaceDevice(NQN, UUID)).toBe("/dev/loop7");
  await target.rpc.call("nvmf_subsystem_add_host", { nqn: NQN, host: HOST });
  expect((await again.list())[0]?.paths[0]?.state).toBe("connecting"); // reconnect delay not over
  clock.advance(2000);
  expect((await again.list())[0]?.paths[0]?.state).toBe("live");

  await again.disconnect(NQN);
  expect(exec.argvOf("losetup").filter((a) => a[1] === "--detach")).toEqual([
    ["losetup", "--detach", "/dev/loop7"],
  ]);
  expect(attached.size).toBe(0);
  expect(await again.list()).toEqual([]);
  expect(await again.findNamespaceDevice(NQN)).toBeUndefined();
  await again.disconnect(NQN);
  await Bun.sleep(20);
  expect(target.emulator.state().subsystems.find((s) => s.nqn === NQN)?.controllers).toEqual([]);
});

test("a link lost for longer than ctrl-loss-tmo removes the controller and its device", async () => {
  const { exec, attached } = fakeLosetup();
  const clock = new ManualClock(5_000_000);
  const init = new SimNvmeInitiator({
    fabric: target.fabric,
    stateDir,
    exec,
    backing: spdkRpcBackingResolver(target.rpc),
    clock,
  });
  await init.connect({ ...params(), reconnectDelay: 1, ctrlLossTmo: 5 });
  expect(attached.size).toBe(1);
  await target.rpc.call("nvmf_subsystem_remove_host", { nqn: NQN, host: HOST });
  await Bun.sleep(20);
  expect((await init.list())[0]?.paths[0]?.state).toBe("connecting");
  clock.advance(3000);
  expect((await init.list())[0]?.paths[0]?.state).toBe("connecting");
  clock.advance(2500);
  expect(await init.list()).toEqual([]);
  expect(attached.size).toBe(0);
  expect(await init.findNamespaceDevice(NQN)).toBeUndefined();
  await target.rpc.call("nvmf_subsystem_add_host", { nqn: NQN, host: HOST });
});

test("rescan needs a live controller", async () => {
  const { exec } = fakeLosetup();
  const init = new SimNvmeInitiator({
    fabric: target.fabric,
    stateDir,
    exec,
    backing: spdkRpcBackingResolver(target.rpc),
  });
  expect((await init.rescan(NQN).catch((e) => e)).kind).toBe("not-found");
});
