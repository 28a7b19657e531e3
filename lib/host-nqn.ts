// The node's persistent NVMe host NQN: the one nvme-cli and the kernel use by default, kept in
// /etc/nvme/hostnqn. NodeStage connects with exactly this identity, so it must not change.
import { StorageError } from "./errors.ts";
import type { HostFs } from "./fs.ts";
import { nqnProblem } from "./spdk/nqn.ts";

export const HOSTNQN_PATH = "/etc/nvme/hostnqn";

/**
 * Reads and checks the host NQN at `path` (trailing whitespace ignored). StorageError
 * "precondition" when the file is missing or unreadable (the node was not set up: run
 * `nvme gen-hostnqn > /etc/nvme/hostnqn`), "invalid" when its content is not a valid NQN.
 */
export async function readHostNqn(fs: HostFs, path = HOSTNQN_PATH): Promise<string> {
  let text: string;
  try {
    text = await fs.readFile(path);
  } catch (err) {
    throw new StorageError(
      "precondition",
      `cannot read the host NQN from ${path}: ${(err as Error).message}`,
      {
        cause: err,
      },
    );
  }
  const nqn = text.trim();
  const problem = nqnProblem(nqn);
  if (problem !== undefined) throw new StorageError("invalid", `host NQN in ${path} ${problem}`);
  return nqn;
}
