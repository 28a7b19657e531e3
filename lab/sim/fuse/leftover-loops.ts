// Loop devices a killed predecessor left over a FUSE block-files mount (its connection dead, as
// after a crash), for the servers that put loop devices over those files (the lab's initiator, the
// emulator's NBD stand-in) to clear at start.

import { type Exec, runChecked } from "../../../lib/exec.ts";
import { detachArgv, LOSETUP_LIST_ARGV, parseLosetupList } from "../../../lib/host/losetup.ts";
import type { Logger } from "../../../lib/log.ts";

/** Detaches every loop device over a file under `dir`; the kernel defers it while one is open. */
export async function detachLoopsUnder(
  exec: Exec,
  dir: string,
  log: Logger,
  timeoutMs = 30_000,
): Promise<void> {
  const loops = parseLosetupList(await runChecked(exec, LOSETUP_LIST_ARGV, { timeoutMs }));
  for (const l of loops) {
    if (!l.backFile.startsWith(`${dir}/`)) continue;
    await runChecked(exec, detachArgv(l.name), { timeoutMs }).catch(() => {});
    log.info("detached a loop device left by a previous incarnation", { device: l.name, file: l.backFile });
  }
}
