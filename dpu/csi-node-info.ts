// The DPU's CSI identity for kubelet: a CSI Identity and a Node service whose only real call is
// NodeGetInfo, so that kubelet (through the node-driver registrar) records the DPU's node ID, and
// with it the DPU's host NQN, in the DPU Node's CSINode. Node authorization lets only that node's
// kubelet write it, which is why the plugin no longer writes anything on its Node.
import type { ServiceImpl } from "@connectrpc/connect";
import type { Identity, Node } from "../gen/csi/v1/csi_pb.ts";
import { formatNodeId } from "../lib/csi-node-id.ts";
import { DRIVER_NAME } from "../lib/volume-context.ts";

export interface CsiNodeInfoOptions {
  /** The DPU's Kubernetes Node name. */
  nodeName: string;
  /** The NQN SNAP connects as. */
  hostNqn: string;
  vendorVersion: string;
  /** Undefined when ready, else why not (Probe answers ready=false then). */
  notReady(): Promise<string | undefined>;
}

/**
 * Identity (storage.distort.io, no capabilities: no controller, no topology) and Node
 * (NodeGetInfo: `<node name>/<host NQN>`; no node capabilities, so kubelet never stages or
 * publishes through it). The other Node calls stay UNIMPLEMENTED: volumes reach the host through
 * SNAP, not through kubelet mounts on the DPU.
 */
export function createCsiNodeInfo(o: CsiNodeInfoOptions): {
  identity: Partial<ServiceImpl<typeof Identity>>;
  node: Partial<ServiceImpl<typeof Node>>;
} {
  const nodeId = formatNodeId(o.nodeName, o.hostNqn);
  return {
    identity: {
      getPluginInfo: () => ({ name: DRIVER_NAME, vendorVersion: o.vendorVersion }),
      getPluginCapabilities: () => ({ capabilities: [] }),
      probe: async () => ({ ready: (await o.notReady()) === undefined }),
    },
    node: {
      nodeGetInfo: () => ({ nodeId, maxVolumesPerNode: 0n }),
      nodeGetCapabilities: () => ({ capabilities: [] }),
    },
  };
}
