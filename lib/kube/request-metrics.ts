// Counts every request a KubeConnection sends, by verb and resource (client-go's
// rest_client_requests_total, with the resource spelled out), so a component's API cost can be
// read from its /metrics and asserted by counting rather than by timing.
import type { Registry } from "../metrics.ts";

/** Called once per request after its response headers arrive (code 0: no response). Must not throw. */
export type RequestObserver = (method: string, url: string, code: number) => void;

export interface RequestKind {
  /** GET, LIST, WATCH, POST, PUT, PATCH, DELETE (LIST/WATCH as the apiserver's metrics name them). */
  verb: string;
  /** Plural resource, with "/subresource" when there is one, e.g. "nvmedevices/status". */
  resource: string;
}

/**
 * Classifies a request URL (absolute or a path, with query) the way the apiserver does: a GET on
 * a collection is LIST, with watch=1 (or true) WATCH. Paths that are not resource paths
 * (/version, /openapi) keep their first segment as resource.
 */
export function classifyRequest(method: string, url: string): RequestKind {
  const u = new URL(url, "http://x");
  const parts = u.pathname.split("/").filter(Boolean);
  // /api/v1/... or /apis/<group>/<version>/...
  let rest: string[];
  if (parts[0] === "api") rest = parts.slice(2);
  else if (parts[0] === "apis") rest = parts.slice(3);
  else return { verb: method.toUpperCase(), resource: parts[0] ?? "" };
  if (rest[0] === "namespaces" && rest.length >= 3) rest = rest.slice(2);
  const [resource = "", name, sub] = rest;
  const watch = u.searchParams.get("watch");
  let verb = method.toUpperCase();
  if (verb === "GET" && (watch === "1" || watch === "true")) verb = "WATCH";
  else if (verb === "GET" && name === undefined) verb = "LIST";
  return { verb, resource: sub ? `${resource}/${sub}` : resource };
}

/** Registers distort_kube_requests_total on `registry` and returns the observer that feeds it. */
export function kubeRequestCounter(registry: Registry): RequestObserver {
  const requests = registry.counter<"verb" | "resource" | "code">({
    name: "distort_kube_requests_total",
    help: "Requests sent to the Kubernetes API server, by verb, resource and HTTP code (0: no response).",
    labelNames: ["verb", "resource", "code"],
    reuse: true,
  });
  return (method, url, code) => {
    const k = classifyRequest(method, url);
    requests.inc({ verb: k.verb, resource: k.resource, code: String(code) });
  };
}
