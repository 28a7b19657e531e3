// classifyRequest names requests as the apiserver's own metrics do, and the counter feeds
// distort_kube_requests_total.
import { expect, test } from "bun:test";
import { Registry } from "../metrics.ts";
import { classifyRequest, kubeRequestCounter } from "./request-metrics.ts";

const G = "/apis/storage.distort.io/v1alpha1";

test.each([
  ["GET", `${G}/nvmedevices`, "LIST", "nvmedevices"],
  ["GET", `${G}/nvmedevices?watch=1&resourceVersion=5`, "WATCH", "nvmedevices"],
  ["GET", `${G}/nvmedevices/d1`, "GET", "nvmedevices"],
  ["PUT", `${G}/nvmedevices/d1/status`, "PUT", "nvmedevices/status"],
  ["PATCH", `https://10.0.0.1:6443${G}/namespaces/apps/nvmepartitions/p1`, "PATCH", "nvmepartitions"],
  ["GET", `${G}/namespaces/apps/nvmepartitions?labelSelector=a%3Db`, "LIST", "nvmepartitions"],
  ["post", "/apis/events.k8s.io/v1/namespaces/default/events", "POST", "events"],
  ["GET", "/api/v1/namespaces/apps", "GET", "namespaces"],
  ["GET", "/api/v1/namespaces", "LIST", "namespaces"],
  ["GET", "/version", "GET", "version"],
])("%s %s is %s %s", (method, url, verb, resource) => {
  expect(classifyRequest(method, url)).toEqual({ verb, resource });
});

test("the counter labels by verb, resource and code", () => {
  const registry = new Registry();
  const observe = kubeRequestCounter(registry);
  observe("PUT", `${G}/nvmedevices/d1/status`, 200);
  observe("PUT", `${G}/nvmedevices/d1/status`, 200);
  observe("PUT", `${G}/nvmedevices/d1/status`, 409);
  const text = registry.render();
  expect(text).toContain(
    'distort_kube_requests_total{verb="PUT",resource="nvmedevices/status",code="200"} 2',
  );
  expect(text).toContain(
    'distort_kube_requests_total{verb="PUT",resource="nvmedevices/status",code="409"} 1',
  );
});
