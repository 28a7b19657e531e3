// The contract between the CSI controller and the CSI node: keys of the volume context
// (CreateVolume -> PV -> NodeStage) and of the publish context (ControllerPublish -> NodeStage).
// Values are strings (CSI maps); both sides parse them with these schemas.
import * as v from "valibot";

export const DRIVER_NAME = "storage.distort.io";

/** volume_context keys, set by CreateVolume from the Exported NVMePartition. */
export const VolumeContextKeys = {
  nqn: "storage.distort.io/nqn",
  portalIP: "storage.distort.io/portalIP",
  portalPort: "storage.distort.io/portalPort",
  transport: "storage.distort.io/transport",
  /**
   * Further portals of the same subsystem (multipath), "ip:port" comma-separated (IPv6 as
   * "[addr]:port"); optional, so a context with only portalIP/portalPort stays valid.
   */
  portals: "storage.distort.io/portals",
  /** Namespace UUID/NGUID of namespace 1, when the target reports one: NodeStage finds the device by it. */
  namespaceUUID: "storage.distort.io/namespaceUUID",
  /** From StorageClass parameters: nvme connect reconnect settings (seconds). */
  ctrlLossTmo: "storage.distort.io/ctrlLossTmo",
  reconnectDelay: "storage.distort.io/reconnectDelay",
  fastIoFailTmo: "storage.distort.io/fastIoFailTmo",
  /** From the StorageClass parameter mkfsOptions: extra mkfs arguments (lib/mkfs-options.ts). */
  mkfsOptions: "storage.distort.io/mkfsOptions",
} as const;

/** The portals value: "ip:port" comma-separated, IPv6 in brackets (what the schema below parses). */
export function formatPortals(portals: readonly { address: string; port: number }[]): string {
  return portals.map((p) => `${p.address.includes(":") ? `[${p.address}]` : p.address}:${p.port}`).join(",");
}

/** publish_context keys, set by ControllerPublishVolume once AccessReady is True. */
export const PublishContextKeys = {
  /** The host NQN the target ACL allows; NodeStage connects with exactly this one. */
  hostNQN: "storage.distort.io/hostNQN",
  attachmentId: "storage.distort.io/attachmentId",
  /**
   * A replicated volume: every portal serving it or standing by for it (its serving node's,
   * then each copy node's standby), "ip:port" comma-separated as VolumeContextKeys.portals. The
   * node connects them all as paths of one subsystem, so a failover needs no restage.
   */
  portals: "storage.distort.io/portals",
} as const;

const numeric = (what: string, min: number, max: number) =>
  v.pipe(
    v.string(),
    v.regex(/^-?\d+$/, `${what} must be an integer`),
    v.transform(Number),
    v.minValue(min, `${what} must be >= ${min}`),
    v.maxValue(max, `${what} must be <= ${max}`),
  );

/** A portals value (formatPortals' output), parsed into addresses and ports. */
const PortalListSchema = v.pipe(
  v.string(),
  v.transform((s) => s.split(",").filter((x) => x.trim() !== "")),
  v.array(
    v.pipe(
      v.string(),
      v.regex(
        /^(\d{1,3}(\.\d{1,3}){3}|\[[0-9a-fA-F:]+\]):\d{1,5}$/,
        "portals must be ip:port, comma-separated",
      ),
      v.transform((x) => {
        const at = x.lastIndexOf(":");
        return { address: x.slice(0, at).replace(/^\[|\]$/g, ""), port: Number(x.slice(at + 1)) };
      }),
      v.check((p) => p.port >= 1 && p.port <= 65535, "portals port must be 1..65535"),
    ),
  ),
);

export const VolumeContextSchema = v.object({
  [VolumeContextKeys.nqn]: v.pipe(
    v.string(),
    v.regex(/^nqn\.\d{4}-\d{2}\.[^:]+:.+$/, "nqn is not an NQN"),
    v.maxLength(223),
  ),
  [VolumeContextKeys.portalIP]: v.pipe(v.string(), v.ip("portalIP is not an IP address")),
  [VolumeContextKeys.portalPort]: numeric("portalPort", 1, 65535),
  [VolumeContextKeys.transport]: v.picklist(["rdma", "tcp"], "transport must be rdma or tcp"),
  [VolumeContextKeys.portals]: v.optional(PortalListSchema),
  [VolumeContextKeys.namespaceUUID]: v.optional(v.string()),
  [VolumeContextKeys.ctrlLossTmo]: v.optional(numeric("ctrlLossTmo", -1, 86400)),
  [VolumeContextKeys.reconnectDelay]: v.optional(numeric("reconnectDelay", 1, 3600)),
  [VolumeContextKeys.fastIoFailTmo]: v.optional(numeric("fastIoFailTmo", -1, 86400)),
  [VolumeContextKeys.mkfsOptions]: v.optional(v.pipe(v.string(), v.maxLength(1024))),
});
export type VolumeContext = v.InferOutput<typeof VolumeContextSchema>;

export const PublishContextSchema = v.object({
  [PublishContextKeys.hostNQN]: v.pipe(
    v.string(),
    v.regex(/^nqn\.\d{4}-\d{2}\.[^:]+:.+$/, "hostNQN is not an NQN"),
  ),
  [PublishContextKeys.attachmentId]: v.pipe(v.string(), v.minLength(1)),
  [PublishContextKeys.portals]: v.optional(PortalListSchema),
});
export type PublishContext = v.InferOutput<typeof PublishContextSchema>;
