// kubelet's volume health (feature gate CSIVolumeHealth, alpha) reads CSI v1.9's alpha
// VolumeCondition: NodeGetVolumeStatsResponse field 2, `message VolumeCondition { bool abnormal = 1;
// string message = 2; }`, offered by NodeServiceCapability.RPC.Type VOLUME_CONDITION = 4. The CSI
// spec this driver is generated from (v1.13) removed both in favour of NodeGetVolumeHealth, which
// kubelet v1.36 (built against spec v1.9.0) does not call. So the driver writes the alpha field as
// the wire carries it: an unknown field on the v1.13 message, read by kubelet as a known one.
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { BinaryReader, BinaryWriter, WireType } from "@bufbuild/protobuf/wire";
import {
  type NodeGetVolumeStatsResponse,
  NodeGetVolumeStatsResponseSchema,
  type NodeServiceCapability_RPC_Type,
  type VolumeUsageSchema,
} from "../../gen/csi/v1/csi_pb.ts";

/** NodeServiceCapability.RPC.Type VOLUME_CONDITION in CSI v1.9 (value 4, reserved since v1.13). */
export const VOLUME_CONDITION_RPC = 4 as NodeServiceCapability_RPC_Type;

/** NodeGetVolumeStatsResponse.volume_condition's field number in CSI v1.9. */
const VOLUME_CONDITION_FIELD = 2;

/** kubelet shows the message in its metrics' logs and events: keep it bounded. */
const MAX_MESSAGE = 1024;

/** The response with usage and, as field 2, the condition kubelet reads. */
export function statsWithCondition(
  usage: MessageInitShape<typeof VolumeUsageSchema>[],
  condition: { abnormal: boolean; message: string },
): NodeGetVolumeStatsResponse {
  const msg = create(NodeGetVolumeStatsResponseSchema, { usage });
  const text =
    condition.message.length > MAX_MESSAGE
      ? `${condition.message.slice(0, MAX_MESSAGE - 1)}…`
      : condition.message;
  const w = new BinaryWriter();
  if (condition.abnormal) w.tag(1, WireType.Varint).bool(true);
  if (text !== "") w.tag(2, WireType.LengthDelimited).string(text);
  const body = w.finish();
  const field = new BinaryWriter().bytes(body).finish();
  msg.$unknown = [{ no: VOLUME_CONDITION_FIELD, wireType: WireType.LengthDelimited, data: field }];
  return msg;
}

/** The condition a response carries, read as kubelet reads it; undefined when it has none. */
export function conditionOf(bytes: Uint8Array): { abnormal: boolean; message: string } | undefined {
  const r = new BinaryReader(bytes);
  let found: { abnormal: boolean; message: string } | undefined;
  while (r.pos < r.len) {
    const [no, wt] = r.tag();
    if (no !== VOLUME_CONDITION_FIELD || wt !== WireType.LengthDelimited) {
      r.skip(wt);
      continue;
    }
    const inner = new BinaryReader(r.bytes());
    const c = { abnormal: false, message: "" };
    while (inner.pos < inner.len) {
      const [f, w] = inner.tag();
      if (f === 1 && w === WireType.Varint) c.abnormal = inner.bool();
      else if (f === 2 && w === WireType.LengthDelimited) c.message = inner.string();
      else inner.skip(w);
    }
    found = c;
  }
  return found;
}
