// One connection to a kube-apiserver: credentials and TLS from a kubeconfig (or the in-cluster
// service account), client-node API classes bound to Bun's fetch, and a raw request function for
// streaming watches. Every Kubernetes call in DISTORT goes through a KubeConnection.
import * as k8s from "@kubernetes/client-node";
import { StorageError } from "../errors.ts";
import type { RequestObserver } from "./request-metrics.ts";

/** TLS material for Bun's fetch, taken from the kubeconfig's current cluster and user. */
interface TlsOptions {
  ca?: string;
  cert?: string;
  key?: string;
  rejectUnauthorized?: boolean;
}

export interface KubeConnection {
  readonly kc: k8s.KubeConfig;
  readonly server: string;
  /** A client-node API class (CoreV1Api, CustomObjectsApi, CoordinationV1Api...) on this connection. */
  api<T>(cls: new (config: k8s.Configuration) => T): T;
  /** A raw authenticated request to a path under the server; used for watches (streaming bodies). */
  request(
    path: string,
    init?: { method?: string; body?: string; contentType?: string; signal?: AbortSignal },
  ): Promise<Response>;
}

function text(v: unknown): string | undefined {
  if (v === undefined || v === null) return undefined;
  if (Array.isArray(v)) return v.map((x) => text(x)).join("");
  return Buffer.isBuffer(v) ? v.toString("utf8") : String(v);
}

/**
 * client-node's default HTTP library uses undici, whose TLS options Bun does not honour: this one
 * sends the generated client's requests through Bun's fetch with the kubeconfig's CA and client
 * certificate. Authentication headers are already set on the request by client-node.
 */
class BunFetchLibrary implements k8s.PromiseHttpLibrary {
  constructor(
    private readonly tls: () => Promise<TlsOptions>,
    private readonly observe: RequestObserver,
    private readonly timeoutMs: number,
  ) {}

  async send(req: k8s.RequestContext): Promise<k8s.ResponseContext> {
    const body = req.getBody() as RequestInit["body"];
    const method = req.getHttpMethod().toString();
    const tls = await this.tls();
    const own = req.getSignal() as AbortSignal | undefined;
    const deadline = this.timeoutMs > 0 ? AbortSignal.timeout(this.timeoutMs) : undefined;
    const signal = own && deadline ? AbortSignal.any([own, deadline]) : (own ?? deadline);
    const late = (err: unknown) =>
      deadline?.aborted && !own?.aborted
        ? new StorageError(
            "timeout",
            `${method} ${req.getUrl()}: no complete reply from the API server within ${this.timeoutMs} ms`,
            { cause: err },
          )
        : err;
    let res: Response;
    let buf: Buffer;
    try {
      res = await observed(this.observe, method, req.getUrl(), () =>
        fetch(req.getUrl(), { method, headers: req.getHeaders(), body, signal, tls }),
      );
      buf = Buffer.from(await res.arrayBuffer());
    } catch (err) {
      throw late(err);
    }
    const headers: Record<string, string> = {};
    res.headers.forEach((value, name) => {
      headers[name] = value;
    });
    return new k8s.ResponseContext(res.status, headers, {
      text: async () => buf.toString("utf8"),
      binary: async () => buf,
      stream: () => new Blob([buf]).stream(),
    });
  }
}

/** Runs `send`, reporting its method, URL and status (0 when it threw) to `observe`. */
async function observed(
  observe: RequestObserver,
  method: string,
  url: string,
  send: () => Promise<Response>,
): Promise<Response> {
  let code = 0;
  try {
    const res = await send();
    code = res.status;
    return res;
  } finally {
    try {
      observe(method, url, code);
    } catch {
      // an observer must not break requests
    }
  }
}

export interface ConnectOptions {
  /** Told about every request sent (see request-metrics.ts); none by default. */
  onRequest?: RequestObserver;
  /**
   * Deadline of each request through api() (reply and body), in ms; 0: none. A connection that
   * stops answering would otherwise hold a controller's key forever (its reconcile never ends, so
   * the key is never handed out again). Watches (request()) stream and have none.
   */
  requestTimeoutMs?: number;
}

/** Default deadline of a request through api(): well above any list the apiserver serves. */
export const DEFAULT_REQUEST_TIMEOUT_MS = 60_000;

/**
 * Connects with a kubeconfig file, or with the in-cluster service account when `kubeconfigPath`
 * is undefined and the process runs in a Pod. Does not contact the server.
 */
export function connect(kubeconfigPath?: string, opts: ConnectOptions = {}): KubeConnection {
  const kc = new k8s.KubeConfig();
  if (kubeconfigPath) kc.loadFromFile(kubeconfigPath);
  else kc.loadFromCluster();
  return fromKubeConfig(kc, opts);
}

export function fromKubeConfig(kc: k8s.KubeConfig, opts: ConnectOptions = {}): KubeConnection {
  const observe: RequestObserver = opts.onRequest ?? (() => {});
  const cluster = kc.getCurrentCluster();
  if (!cluster) throw new StorageError("invalid", "kubeconfig has no current cluster");
  const server = cluster.server.replace(/\/+$/, "");
  let tlsCache: Promise<TlsOptions> | undefined;
  const tls = () => {
    tlsCache ??= (async () => {
      const opts: { ca?: unknown; cert?: unknown; key?: unknown } = {};
      await kc.applyToHTTPSOptions(opts as never);
      return {
        ca: text(opts.ca),
        cert: text(opts.cert),
        key: text(opts.key),
        rejectUnauthorized: !cluster.skipTLSVerify,
      };
    })();
    return tlsCache;
  };
  const timeoutMs = opts.requestTimeoutMs ?? DEFAULT_REQUEST_TIMEOUT_MS;
  if (!Number.isFinite(timeoutMs) || timeoutMs < 0)
    throw new StorageError("invalid", `requestTimeoutMs must be a number of ms >= 0, not ${timeoutMs}`);
  const httpApi = k8s.wrapHttpLibrary(new BunFetchLibrary(tls, observe, timeoutMs));
  const config = k8s.createConfiguration({
    baseServer: new k8s.ServerConfiguration(server, {}),
    authMethods: { default: kc },
    httpApi,
  });
  return {
    kc,
    server,
    api: (cls) => new cls(config),
    async request(path, init = {}) {
      // applyToFetchOptions would build an undici agent; only the headers are needed here.
      const opts: { headers?: Record<string, string> } = {};
      await kc.applyToHTTPSOptions(opts as never);
      const headers: Record<string, string> = { accept: "application/json", ...(opts.headers ?? {}) };
      if (init.contentType) headers["content-type"] = init.contentType;
      const method = init.method ?? "GET";
      const t = await tls();
      return observed(observe, method, path, () =>
        fetch(`${server}${path}`, { method, headers, body: init.body, signal: init.signal, tls: t }),
      );
    },
  };
}
