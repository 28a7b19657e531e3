// The DPF IdentityService: who the plugin is (a domain-style name, its version, a manifest of its
// configuration) and whether it is healthy and ready, from Readiness.
import type { ServiceImpl } from "@connectrpc/connect";
import type { IdentityService } from "../gen/nvidia/storage/plugins/v1/plugin_pb.ts";
import { DRIVER_NAME } from "../lib/volume-context.ts";
import type { Readiness } from "./readiness.ts";

/** GetPluginInfo's name: RFC 1035 domain notation, at most 63 characters (the DPF contract). */
export const PLUGIN_INFO_NAME = DRIVER_NAME;

export interface IdentityOptions {
  vendorVersion: string;
  /** Opaque key/value facts about this instance (plugin name, provider, host NQN...). */
  manifest: Readonly<Record<string, string>>;
  readiness: Readiness;
}

/**
 * The IdentityService. GetPluginInfo is constant and side-effect free. Probe answers OK with
 * ready=false while the plugin initialises or SNAP does not answer, and fails (INTERNAL) only when
 * the plugin's own state is unusable, the one case where a restart by the CO may help.
 */
export function createIdentityService(o: IdentityOptions): Partial<ServiceImpl<typeof IdentityService>> {
  const manifest = { ...o.manifest };
  return {
    getPluginInfo: () => ({ name: PLUGIN_INFO_NAME, vendorVersion: o.vendorVersion, manifest }),
    probe: async () => ({ ready: (await o.readiness.check()).ready }),
  };
}
