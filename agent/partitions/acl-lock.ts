// One lock per export NQN, shared by every controller of this process that writes an export's
// ACL (partitions and attachments): each computes the hosts from the watch caches and applies
// them while holding it, so a pass that computed its list before an attachment changed can never
// apply that list after a newer pass applied the new one (a revoked host re-admitted, the new
// owner cut off while its attachment already reads AccessReady).
import { KeyedMutex } from "../../lib/concurrency/keyed-mutex.ts";

/** The process-wide ACL locks, keyed by subsystem NQN. Never call run() again inside a task. */
export const aclLocks = new KeyedMutex();
