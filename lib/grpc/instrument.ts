// Transport-neutral wrapping of a Connect service implementation: every call is logged once
// (method, code, duration, redacted request) and every thrown error goes through status.ts.

import { type DescMessage, type DescService, type Message, toJson } from "@bufbuild/protobuf";
import {
  Code,
  ConnectError,
  createServiceImplSpec,
  type MethodImplSpec,
  type ServiceImpl,
  type ServiceImplSpec,
} from "@connectrpc/connect";
import { StorageError } from "../errors";
import { type Logger, redact } from "../log";
import { codeName, toConnectError } from "./status";

/** A service to serve: a generated GenService descriptor and a (possibly partial) implementation. */
export interface ServiceRegistration<S extends DescService = DescService> {
  service: S;
  /** Methods left out answer UNIMPLEMENTED, as CSI and the DPF contract require. */
  impl: Partial<ServiceImpl<S>>;
}

/**
 * Binds a registration's descriptor to its implementation, keeping the pairing type-checked at
 * the call site (an array literal of registrations would widen the impl to any service's).
 */
export function register<S extends DescService>(
  service: S,
  impl: Partial<ServiceImpl<S>>,
): ServiceRegistration {
  return { service, impl } as unknown as ServiceRegistration;
}

export interface InstrumentOptions {
  logger: Logger;
  /** Methods (by name, e.g. "Probe") whose successful calls log at debug: health checks are frequent. */
  quietMethods?: readonly string[];
  /** Longest JSON rendering of a request body kept in a log line; longer ones are cut. */
  maxLoggedBodyChars?: number;
}

const DEFAULT_QUIET = ["Probe"];
const DEFAULT_MAX_BODY = 2048;

/**
 * Returns the service's method specs (unimplemented methods filled in) with each handler wrapped:
 * thrown values become ConnectErrors via toConnectError, and one log line per call records
 * `method`, `code`, `durationMs`, the redacted `request` and, on failure, `error`.
 */
export function instrumentService(reg: ServiceRegistration, opts: InstrumentOptions): ServiceImplSpec {
  const spec = createServiceImplSpec(reg.service, reg.impl as Partial<ServiceImpl<DescService>>);
  const quiet = new Set(opts.quietMethods ?? DEFAULT_QUIET);
  const maxBody = opts.maxLoggedBodyChars ?? DEFAULT_MAX_BODY;
  const methods: Record<string, MethodImplSpec> = {};
  for (const [name, m] of Object.entries(spec.methods)) {
    const path = `/${reg.service.typeName}/${m.method.name}`;
    const log = (start: number, request: unknown, err?: ConnectError) => {
      const fields: Record<string, unknown> = {
        method: path,
        code: codeName(err?.code ?? 0),
        durationMs: Math.round((performance.now() - start) * 100) / 100,
        request,
      };
      if (err === undefined) {
        (quiet.has(m.method.name) ? opts.logger.debug : opts.logger.info)("grpc call", fields);
        return;
      }
      fields.error = err.rawMessage;
      const severe = err.code === Code.Internal || err.code === Code.Unknown || err.code === Code.DataLoss;
      (severe ? opts.logger.error : opts.logger.warn)("grpc call", fields);
    };
    methods[name] = wrapMethod(m, m.method.input, maxBody, log);
  }
  return { service: spec.service, methods };
}

type LogCall = (start: number, request: unknown, err?: ConnectError) => void;

function wrapMethod(m: MethodImplSpec, input: DescMessage, maxBody: number, log: LogCall): MethodImplSpec {
  switch (m.kind) {
    case "unary": {
      const impl = m.impl;
      const wrapped: typeof impl = async (req, ctx) => {
        const start = performance.now();
        try {
          const res = await impl(req, ctx);
          log(start, loggableBody(input, req, maxBody));
          return res;
        } catch (e) {
          const err = toConnectError(explain(e, ctx.signal));
          log(start, loggableBody(input, req, maxBody), err);
          throw err;
        }
      };
      return { ...m, impl: wrapped };
    }
    case "server_streaming": {
      const impl = m.impl;
      const wrapped: typeof impl = (req, ctx) =>
        wrapStream(() => impl(req, ctx), loggableBody(input, req, maxBody), ctx.signal, log);
      return { ...m, impl: wrapped };
    }
    case "client_streaming": {
      const impl = m.impl;
      const wrapped: typeof impl = async (reqs, ctx) => {
        const start = performance.now();
        try {
          const res = await impl(reqs, ctx);
          log(start, "<stream>");
          return res;
        } catch (e) {
          const err = toConnectError(explain(e, ctx.signal));
          log(start, "<stream>", err);
          throw err;
        }
      };
      return { ...m, impl: wrapped };
    }
    case "bidi_streaming": {
      const impl = m.impl;
      const wrapped: typeof impl = (reqs, ctx) =>
        wrapStream(() => impl(reqs, ctx), "<stream>", ctx.signal, log);
      return { ...m, impl: wrapped };
    }
  }
}

async function* wrapStream<T>(
  open: () => AsyncIterable<T>,
  request: unknown,
  signal: AbortSignal,
  log: LogCall,
): AsyncIterable<T> {
  const start = performance.now();
  try {
    yield* open();
    log(start, request);
  } catch (e) {
    const err = toConnectError(explain(e, signal));
    log(start, request, err);
    throw err;
  }
}

/**
 * When a handler fails with a plain error because its call was aborted (deadline, client cancel,
 * server shutdown), the abort reason is the truer status than INTERNAL. Errors that already carry
 * a kind or code are kept: the handler chose them.
 */
function explain(e: unknown, signal: AbortSignal): unknown {
  if (e instanceof StorageError || e instanceof ConnectError) return e;
  if (signal.aborted && signal.reason instanceof ConnectError) return signal.reason;
  return e;
}

/**
 * The request as it may appear in a log: proto JSON, secret-looking keys redacted by lib/log's
 * redact() (CSI puts credentials in `secrets` maps), and cut to `max` characters. Redaction runs
 * before the cut, so a truncated string never carries a secret either.
 */
export function loggableBody(schema: DescMessage, msg: Message, max: number): unknown {
  let json: unknown;
  try {
    json = toJson(schema, msg);
  } catch {
    // e.g. an Any whose type is not registered; the method name and code still get logged.
    return "<not representable as JSON>";
  }
  const safe = redact(json);
  const text = JSON.stringify(safe);
  return text.length <= max ? safe : `${text.slice(0, max)}...(${text.length} chars)`;
}
