// What the plugin remembers about each device beyond what SNAP can tell (the request's access
// modes, volume mode and contexts, and whether creation finished): one small JSON file per volume,
// written atomically, so GetDevice and ListDevices survive a plugin restart.
import * as v from "valibot";
import { JsonRecordStore } from "../../lib/json-record-store.ts";

const StringMap = v.record(v.string(), v.string());

const DeviceRecordSchema = v.object({
  version: v.literal(1),
  volumeId: v.pipe(v.string(), v.minLength(1)),
  deviceName: v.pipe(v.string(), v.minLength(1)),
  /** "creating" from before the first change in SNAP until every step is done; then "ready". */
  phase: v.picklist(["creating", "ready"]),
  accessModes: v.array(v.pipe(v.number(), v.integer(), v.minValue(1), v.maxValue(4))),
  volumeMode: v.picklist(["Block", "Filesystem"]),
  nqn: v.pipe(v.string(), v.minLength(1)),
  publishContext: StringMap,
  volumeContext: StringMap,
  storageParameters: StringMap,
  createdAt: v.string(),
  updatedAt: v.string(),
});

/** One device as saved. Carries no secret: storage parameters only name a Secret. */
export type DeviceRecord = v.InferOutput<typeof DeviceRecordSchema>;

/**
 * Durable device records. put() replaces a record atomically (a crash leaves the old or the new
 * one). Callers serialise per volume id; different ids may be used concurrently. A record that
 * cannot be read back is StorageError "internal", never a silent "absent": forgetting a device
 * would hide an attached volume.
 */
export interface DeviceStore {
  get(volumeId: string): Promise<DeviceRecord | undefined>;
  put(record: DeviceRecord): Promise<void>;
  /** Absent is fine. */
  delete(volumeId: string): Promise<void>;
  /** Every record, in no particular order. */
  list(): Promise<DeviceRecord[]>;
  /** Throws unless the store can be read and written (Probe's health check). */
  check(): Promise<void>;
}

/** A DeviceStore of one JSON file per volume id in `dir`, kept by JsonRecordStore's rules. */
export function fileDeviceStore(dir: string): DeviceStore {
  return new JsonRecordStore(dir, {
    schema: DeviceRecordSchema,
    key: (r) => r.volumeId,
    what: "device record",
  });
}
