// Per-method call counters and latency histograms for a served gRPC service, for /metrics. One
// wrapper per binary: it registers `<prefix>_calls_total` and `<prefix>_call_duration_seconds`.
import type { Registry } from "../metrics.ts";
import { codeName, toConnectError } from "./status.ts";

/**
 * Returns a function that wraps every unary handler of a service implementation so each call is
 * counted by method and gRPC code and timed. Create one per registry and prefix (the metrics
 * register once); `what` words the metrics' help text.
 */
export function callMetrics(registry: Registry, prefix: string, what: string) {
  const calls = registry.counter<"method" | "code">({
    name: `${prefix}_calls_total`,
    help: `${what} calls by method and gRPC status code.`,
    labelNames: ["method", "code"],
  });
  const seconds = registry.histogram<"method">({
    name: `${prefix}_call_duration_seconds`,
    help: `${what} call duration by method.`,
    labelNames: ["method"],
    buckets: [0.005, 0.025, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60],
  });
  return <T extends object>(impl: T): T => {
    const out: Record<string, unknown> = {};
    for (const [method, fn] of Object.entries(impl)) {
      const call = fn as (r: unknown, c: unknown) => unknown;
      const count = (started: number, err: unknown) => {
        calls.inc({ method, code: err === undefined ? "OK" : codeName(toConnectError(err).code) });
        seconds.observe({ method }, (performance.now() - started) / 1000);
      };
      out[method] = (req: unknown, ctx: unknown) => {
        const started = performance.now();
        let result: unknown;
        try {
          result = call(req, ctx);
        } catch (err) {
          count(started, err);
          throw err;
        }
        // A server-streaming method: counted when its stream ends, with the code it ends with.
        if (result !== null && typeof result === "object" && Symbol.asyncIterator in result) {
          const stream = result as AsyncIterable<unknown>;
          return (async function* () {
            try {
              yield* stream;
            } catch (err) {
              count(started, err);
              throw err;
            }
            count(started, undefined);
          })();
        }
        return Promise.resolve(result).then(
          (v) => {
            count(started, undefined);
            return v;
          },
          (err: unknown) => {
            count(started, err);
            throw err;
          },
        );
      };
    }
    return out as T;
  };
}
