// Placed events, aggregated: instead of one Event per partition (an API write each), placements
// on one device within a window become one Normal "Placed" Event on that device naming them.
// Each partition's own Scheduled=True condition still says where it went.
import type { NVMeDevice } from "../../api/index.ts";
import type { Clock } from "../../lib/clock.ts";
import { formatBytes } from "../../lib/units.ts";
import type { EventPort } from "../events.ts";

/** Names listed in one digest note; the rest are counted. */
const LISTED = 20;

interface Pending {
  device: NVMeDevice;
  names: string[];
  bytes: number;
  cancel: () => void;
}

/**
 * Collects placements per device and emits one event per device per `windowMs` (the first
 * placement on a quiet device opens the window). flush() emits everything pending at once
 * (on stop). Single-threaded, like the rest of the manager.
 */
export class PlacedDigest {
  readonly #pending = new Map<string, Pending>();

  constructor(
    private readonly events: EventPort,
    private readonly clock: Clock,
    private readonly windowMs: number,
  ) {}

  /** Notes that partition `key` ("ns/name") got `bytes` reserved on `device`. */
  add(device: NVMeDevice, key: string, bytes: number): void {
    const name = device.metadata.name;
    let p = this.#pending.get(name);
    if (!p) {
      const cancel = this.clock.setTimeout(() => this.#emit(name), this.windowMs);
      p = { device, names: [], bytes: 0, cancel };
      this.#pending.set(name, p);
    }
    p.device = device;
    p.names.push(key);
    p.bytes += bytes;
  }

  /** Emits every pending digest now. */
  flush(): void {
    for (const name of [...this.#pending.keys()]) this.#emit(name);
  }

  #emit(name: string): void {
    const p = this.#pending.get(name);
    if (!p) return;
    this.#pending.delete(name);
    p.cancel();
    const n = p.names.length;
    const listed = p.names.slice(0, LISTED).join(", ");
    const more = n > LISTED ? ` and ${n - LISTED} more` : "";
    const what = n === 1 ? "1 partition" : `${n} partitions`;
    const d = p.device;
    this.events.emit(
      d,
      "Normal",
      "Placed",
      "Place",
      `placed ${what} on node ${d.spec.nodeName}, serial ${d.spec.serial}; ${formatBytes(p.bytes)} reserved: ${listed}${more}`,
    );
  }
}
