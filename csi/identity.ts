// The CSI Identity service: who the plugin is (storage.distort.io and its version), what it offers
// (controller service when this process runs one, topology constraints, online expansion), and
// whether it is ready, from readiness checks the process wires in.
import type { ServiceImpl } from "@connectrpc/connect";
import {
  PluginCapability_VolumeExpansion_Type as ExpansionType,
  type Identity,
  PluginCapability_Service_Type as ServiceType,
} from "../gen/csi/v1/csi_pb.ts";
import { errorMessage } from "../lib/errors.ts";
import type { Logger } from "../lib/log.ts";
import { DRIVER_NAME } from "../lib/volume-context.ts";

/** A readiness check: undefined when ready, else why not. Throwing counts as not ready. */
export type ReadinessCheck = () => string | undefined | Promise<string | undefined>;

export interface IdentityOptions {
  /** vendor_version, the package version. */
  vendorVersion: string;
  /** True when this process also serves the Controller service (controller or all mode). */
  controllerService: boolean;
  /** All must pass for Probe to answer ready; run concurrently on every Probe. */
  readiness: readonly ReadinessCheck[];
  logger: Logger;
}

/** Runs every check; the reasons of those that fail (empty when ready). */
export async function notReadyReasons(checks: readonly ReadinessCheck[]): Promise<string[]> {
  const results = await Promise.all(
    checks.map(async (c) => {
      try {
        return await c();
      } catch (err) {
        return errorMessage(err) || "readiness check failed";
      }
    }),
  );
  return results.filter((r): r is string => r !== undefined);
}

/**
 * The Identity implementation. Probe answers ready=false (not an error) while a check fails, so
 * the livenessprobe sidecar and csi-sanity see a well-formed answer; the reason is logged once per
 * transition rather than on every probe.
 */
export function createIdentityService(o: IdentityOptions): Partial<ServiceImpl<typeof Identity>> {
  let lastReady: boolean | undefined;
  return {
    getPluginInfo: () => ({ name: DRIVER_NAME, vendorVersion: o.vendorVersion }),
    getPluginCapabilities: () => ({
      capabilities: [
        ...(o.controllerService
          ? [
              { type: { case: "service" as const, value: { type: ServiceType.CONTROLLER_SERVICE } } },
              { type: { case: "service" as const, value: { type: ServiceType.GROUP_CONTROLLER_SERVICE } } },
              { type: { case: "service" as const, value: { type: ServiceType.SNAPSHOT_METADATA_SERVICE } } },
            ]
          : []),
        { type: { case: "service" as const, value: { type: ServiceType.VOLUME_ACCESSIBILITY_CONSTRAINTS } } },
        { type: { case: "volumeExpansion" as const, value: { type: ExpansionType.ONLINE } } },
      ],
    }),
    probe: async () => {
      const reasons = await notReadyReasons(o.readiness);
      const ready = reasons.length === 0;
      if (ready !== lastReady) {
        lastReady = ready;
        if (ready) o.logger.info("plugin ready");
        else o.logger.warn("plugin not ready", { reasons });
      }
      return { ready };
    },
  };
}

/**
 * A check that the host commands the node service runs are on PATH (`which` resolves a name, as
 * Bun.which does). Reports every missing one at once.
 */
export function hostToolsCheck(
  tools: readonly string[],
  which: (name: string) => string | null,
): ReadinessCheck {
  return () => {
    const missing = tools.filter((t) => !which(t));
    return missing.length ? `host tools missing from PATH: ${missing.join(", ")}` : undefined;
  };
}
