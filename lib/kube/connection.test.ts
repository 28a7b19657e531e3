// The request deadline of api() calls, against a loopback HTTP server that answers some paths,
// never answers one, and sends headers but never finishes the body of another.
import { afterAll, beforeAll, expect, test } from "bun:test";
import * as k8s from "@kubernetes/client-node";
import { StorageError } from "../errors.ts";
import { DEFAULT_REQUEST_TIMEOUT_MS, fromKubeConfig } from "./connection.ts";

let server: ReturnType<typeof Bun.serve>;
const held: (() => void)[] = [];

beforeAll(() => {
  server = Bun.serve({
    hostname: "127.0.0.1",
    port: 0,
    fetch(req) {
      const path = new URL(req.url).pathname;
      if (path === "/api/v1/namespaces/silent")
        return new Promise<Response>((resolve) => held.push(() => resolve(new Response("{}"))));
      if (path === "/api/v1/namespaces/trickle") {
        // Headers at once, then one byte of the body and nothing more.
        let close: () => void = () => {};
        const stream = new ReadableStream({
          start(c) {
            c.enqueue(new TextEncoder().encode("{"));
            close = () => c.close();
          },
        });
        held.push(() => close());
        return new Response(stream, { headers: { "content-type": "application/json" } });
      }
      return Response.json({
        apiVersion: "v1",
        kind: "Namespace",
        metadata: { name: path.split("/").pop() },
      });
    },
  });
});

afterAll(() => {
  for (const f of held) f();
  server.stop(true);
});

function conn(requestTimeoutMs?: number) {
  const kc = new k8s.KubeConfig();
  kc.loadFromOptions({
    clusters: [{ name: "c", server: `http://127.0.0.1:${server.port}`, skipTLSVerify: true }],
    users: [{ name: "u", token: "t" }],
    contexts: [{ name: "x", cluster: "c", user: "u" }],
    currentContext: "x",
  });
  return fromKubeConfig(kc, requestTimeoutMs === undefined ? {} : { requestTimeoutMs });
}

async function failure(p: Promise<unknown>): Promise<unknown> {
  try {
    await p;
  } catch (err) {
    return err;
  }
  throw new Error("the request succeeded");
}

test("a reply within the deadline is returned as usual", async () => {
  const ns = await conn(2000).api(k8s.CoreV1Api).readNamespace({ name: "fine" });
  expect(ns.metadata?.name).toBe("fine");
});

test("a server that never replies fails the call with a timeout StorageError naming the request", async () => {
  const err = await failure(conn(150).api(k8s.CoreV1Api).readNamespace({ name: "silent" }));
  expect(err).toBeInstanceOf(StorageError);
  expect((err as StorageError).kind).toBe("timeout");
  expect((err as StorageError).transient).toBe(true);
  expect((err as StorageError).message).toContain("GET ");
  expect((err as StorageError).message).toContain("/api/v1/namespaces/silent");
  expect((err as StorageError).message).toContain("within 150 ms");
});

test("a body that never ends is covered by the same deadline", async () => {
  const err = await failure(conn(150).api(k8s.CoreV1Api).readNamespace({ name: "trickle" }));
  expect((err as StorageError).kind).toBe("timeout");
});

test("the default deadline is 60 s; a negative or non-number one is refused", () => {
  expect(DEFAULT_REQUEST_TIMEOUT_MS).toBe(60_000);
  expect(() => conn(-1)).toThrow(/requestTimeoutMs must be a number of ms >= 0/);
  expect(() => conn(Number.NaN)).toThrow(/requestTimeoutMs/);
});
