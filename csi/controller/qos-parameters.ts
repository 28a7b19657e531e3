// The QoS keys of StorageClass parameters and VolumeAttributesClass (mutable) parameters, parsed
// into NVMePartition spec.qos limits. One spelling for both maps, so a VolumeAttributesClass can
// change exactly what a StorageClass set. Pure.
import { type Backend, MAX_QOS_IOPS, MAX_QOS_MBPS, QOS_IOPS_UNIT, type QosLimits } from "../../api/index.ts";
import { invalidArgument } from "../errors.ts";

/** Parameter key -> spec.qos field, with the largest value accepted. */
export const QOS_PARAMETERS = {
  "qos.rwIops": { field: "rwIosPerSec", max: MAX_QOS_IOPS },
  "qos.rwMBps": { field: "rwMBytesPerSec", max: MAX_QOS_MBPS },
  "qos.rMBps": { field: "rMBytesPerSec", max: MAX_QOS_MBPS },
  "qos.wMBps": { field: "wMBytesPerSec", max: MAX_QOS_MBPS },
} as const satisfies Record<string, { field: keyof QosLimits; max: number }>;

export type QosParameter = keyof typeof QOS_PARAMETERS;

/** The keys, for error messages and the parameter list. */
export const QOS_PARAMETER_KEYS: readonly QosParameter[] = Object.keys(QOS_PARAMETERS) as QosParameter[];

export function isQosParameter(key: string): key is QosParameter {
  return Object.hasOwn(QOS_PARAMETERS, key);
}

/**
 * Parses the qos.* entries of `raw` (other keys are the caller's business) into the limits they
 * name; undefined when there are none. Values are decimal integers >= 0 (0: unlimited); qos.rwIops
 * must be a multiple of 1000, SPDK's step, because SPDK would silently round any other value up.
 * Throws INVALID_ARGUMENT naming `field` and the key.
 */
export function parseQos(raw: Readonly<Record<string, string>>, field: string): QosLimits | undefined {
  const out: QosLimits = {};
  let any = false;
  for (const [key, value] of Object.entries(raw)) {
    if (!isQosParameter(key)) continue;
    const { field: target, max } = QOS_PARAMETERS[key];
    if (!/^\d{1,16}$/.test(value))
      throw invalidArgument(`${field} ${key}: ${JSON.stringify(value)} is not a whole number >= 0`);
    const n = Number(value);
    if (n > max) throw invalidArgument(`${field} ${key}: ${n} is above the maximum ${max}`);
    if (key === "qos.rwIops" && n % QOS_IOPS_UNIT !== 0) {
      throw invalidArgument(
        `${field} ${key}: ${n} is not a multiple of ${QOS_IOPS_UNIT} (SPDK enforces IOPS limits in steps of ${QOS_IOPS_UNIT})`,
      );
    }
    out[target] = n;
    any = true;
  }
  return any ? out : undefined;
}

/**
 * Parses a mutable_parameters map (CreateVolume or ControllerModifyVolume): only qos.* keys are
 * mutable. Throws INVALID_ARGUMENT for any other key; undefined for an empty map.
 */
export function parseMutableParameters(
  raw: Readonly<Record<string, string>>,
  field = "mutable_parameters",
): QosLimits | undefined {
  const unknown = Object.keys(raw).filter((k) => !isQosParameter(k));
  if (unknown.length > 0) {
    throw invalidArgument(
      `${field}: unknown key${unknown.length > 1 ? "s" : ""} ${unknown
        .sort()
        .map((k) => JSON.stringify(k))
        .join(", ")} (mutable parameters DISTORT understands: ${QOS_PARAMETER_KEYS.join(", ")})`,
    );
  }
  return parseQos(raw, field);
}

/** Whether `q` sets a limit (a value above 0). */
export function limitsSomething(q: QosLimits | undefined): boolean {
  return q !== undefined && Object.values(q).some((n) => n !== undefined && n > 0);
}

/**
 * Refuses limits a backend cannot enforce: nvmet (the kernel backend) has no per-namespace rate
 * limits, so any limit above 0 is INVALID_ARGUMENT there. All-zero limits pass (unlimited is what
 * nvmet does anyway) and are dropped by the caller.
 */
export function requireQosBackend(backend: Backend, q: QosLimits | undefined, field: string): void {
  if (backend !== "spdk" && limitsSomething(q)) {
    throw invalidArgument(
      `${field}: QoS limits need backend spdk; the kernel backend (nvmet) has no per-namespace rate limits to enforce them`,
    );
  }
}

/** The four limits with every absent one 0: how the agent reports status.qos. */
export function completeQos(q: QosLimits | undefined): Required<QosLimits> {
  return {
    rwIosPerSec: q?.rwIosPerSec ?? 0,
    rwMBytesPerSec: q?.rwMBytesPerSec ?? 0,
    rMBytesPerSec: q?.rMBytesPerSec ?? 0,
    wMBytesPerSec: q?.wMBytesPerSec ?? 0,
  };
}
