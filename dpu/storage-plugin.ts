// The DPF StoragePluginService: capabilities, the SNAP provider, and the device RPCs, each request
// validated (dpu/devices/request.ts) before the DeviceManager touches SNAP or the DPU.
import type { ServiceImpl } from "@connectrpc/connect";
import {
  StoragePluginServiceCapability_RPC_Type as CapabilityType,
  type StoragePluginService,
} from "../gen/nvidia/storage/plugins/v1/plugin_pb.ts";
import type { DeviceManager } from "./devices/device-manager.ts";
import { parseCreateDevice, parseDeviceRef, parseMaxEntries } from "./devices/request.ts";

/** Everything the contract defines: block and filesystem devices, device stats (GetDevice), listing. */
export const CAPABILITIES: readonly CapabilityType[] = [
  CapabilityType.CREATE_DELETE_BLOCK_DEVICE,
  CapabilityType.CREATE_DELETE_FS_DEVICE,
  CapabilityType.GET_DEVICE_STATS,
  CapabilityType.LIST_DEVICES,
];

export interface StoragePluginOptions {
  devices: DeviceManager;
  /** GetSNAPProvider's answer: "" for NVIDIA's default SNAP process. */
  snapProvider: string;
}

/**
 * The StoragePluginService. Every method is implemented; each is idempotent as the contract asks
 * (see DeviceManager). Invalid requests are INVALID_ARGUMENT before anything changes.
 */
export function createStoragePluginService(
  o: StoragePluginOptions,
): Partial<ServiceImpl<typeof StoragePluginService>> {
  return {
    storagePluginGetCapabilities: () => ({
      capabilities: CAPABILITIES.map((type) => ({ type: { case: "rpc" as const, value: { type } } })),
    }),
    getSNAPProvider: () => ({ providerName: o.snapProvider }),
    createDevice: async (req) => ({ deviceName: await o.devices.create(parseCreateDevice(req)) }),
    deleteDevice: async (req) => {
      await o.devices.delete(parseDeviceRef(req));
      return {};
    },
    getDevice: async (req) => {
      const d = await o.devices.get(parseDeviceRef(req));
      return {
        accessModes: [...d.accessModes],
        volumeMode: d.volumeMode,
        publishContext: { ...d.publishContext },
        volumeContext: { ...d.volumeContext },
        storageParameters: { ...d.storageParameters },
      };
    },
    listDevices: async (req) => {
      const page = await o.devices.list(parseMaxEntries(req.maxEntries), req.startingToken);
      return {
        entries: page.entries.map((d) => ({ volumeId: d.volumeId, deviceName: d.deviceName })),
        nextToken: page.nextToken,
      };
    },
  };
}
