// A backup client of Kubernetes' SnapshotMetadata API, as a backup application would be: it finds
// the driver's SnapshotMetadataService object (address, CA, audience), gets a ServiceAccount token
// for that audience (TokenRequest), dials the csi-snapshot-metadata sidecar over TLS checked against
// that CA and the address's host name, and collects GetMetadataAllocated / GetMetadataDelta streams.
// The lab has no cluster DNS and its host no Service routing, but it routes every Pod CIDR: the
// address's Service is reached at one of its ready EndpointSlice endpoints.
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import * as grpc from "@grpc/grpc-js";
import * as k8s from "@kubernetes/client-node";
import {
  type BlockMetadata,
  BlockMetadataType,
  type GetMetadataAllocatedRequest,
  GetMetadataAllocatedRequestSchema,
  type GetMetadataAllocatedResponse,
  GetMetadataAllocatedResponseSchema,
  type GetMetadataDeltaRequest,
  GetMetadataDeltaRequestSchema,
  type GetMetadataDeltaResponse,
  GetMetadataDeltaResponseSchema,
  SnapshotMetadata,
} from "../gen/snapshot-metadata/schema_pb.ts";
import type { KubeConnection } from "../lib/kube/connection.ts";

export { BlockMetadataType };

const CBT_GROUP = "cbt.storage.k8s.io";
const CBT_VERSION = "v1beta1";
const SNAPSHOT_GROUP = "snapshot.storage.k8s.io";

/** What a SnapshotMetadataService object tells a client. */
export interface SnapshotMetadataServiceInfo {
  /** The object's name: the CSI driver's. */
  driver: string;
  /** spec.address: `<host>:<port>`, the host a name in the server certificate. */
  address: string;
  /** spec.caCert decoded: the PEM the server certificate must chain to. */
  caPem: string;
  audience: string;
}

/** A failed call: the gRPC status code and the server's message. */
export class SnapshotMetadataError extends Error {
  override readonly name = "SnapshotMetadataError";
  constructor(
    readonly code: number,
    readonly details: string,
  ) {
    super(`${grpc.status[code] ?? code}: ${details}`);
  }
}

/** One data range, in bytes. */
export interface ByteRange {
  offset: bigint;
  size: bigint;
}

/** A whole stream, collected. */
export interface MetadataStream {
  /** The style of the first message (every message of a stream carries the same). */
  blockMetadataType: BlockMetadataType;
  volumeCapacityBytes: bigint;
  ranges: ByteRange[];
  /** Response messages received; with maxResults n, none holds more than n ranges. */
  messages: number;
  /** The largest number of ranges one message held. */
  largestMessage: number;
}

/**
 * Reads the SnapshotMetadataService named `driver` (cluster-scoped). Throws with the API error when
 * it is missing or unreadable, or when its caCert is not base64 PEM.
 */
export async function readSnapshotMetadataService(
  conn: KubeConnection,
  driver: string,
): Promise<SnapshotMetadataServiceInfo> {
  const custom = conn.api(k8s.CustomObjectsApi);
  const obj = (await custom.getClusterCustomObject({
    group: CBT_GROUP,
    version: CBT_VERSION,
    plural: "snapshotmetadataservices",
    name: driver,
  })) as { spec?: { address?: string; caCert?: string; audience?: string } };
  const spec = obj.spec ?? {};
  const caPem = Buffer.from(spec.caCert ?? "", "base64").toString("utf8");
  if (!caPem.includes("-----BEGIN CERTIFICATE-----"))
    throw new Error(`SnapshotMetadataService ${driver}: spec.caCert is not a base64 PEM certificate`);
  if (!spec.address || !spec.audience)
    throw new Error(`SnapshotMetadataService ${driver}: spec.address or spec.audience is empty`);
  return { driver, address: spec.address, caPem, audience: spec.audience };
}

/**
 * A token of ServiceAccount `ns/sa` for `audience` (TokenRequest, what a backup application in a
 * Pod would mint for itself). expirationSeconds: the API server's minimum is 600.
 */
export async function serviceAccountToken(
  conn: KubeConnection,
  ns: string,
  sa: string,
  audience: string,
  expirationSeconds = 600,
): Promise<string> {
  const res = await conn.api(k8s.CoreV1Api).createNamespacedServiceAccountToken({
    name: sa,
    namespace: ns,
    body: { spec: { audiences: [audience], expirationSeconds } },
  });
  const token = res.status?.token;
  if (!token) throw new Error(`TokenRequest for ${ns}/${sa} returned no token`);
  return token;
}

/**
 * The address (`<ip>:<port>`) of a ready endpoint behind the Service that `address`
 * (`<service>.<namespace>[.svc...]:<port>`) names, from its EndpointSlices. Throws when the host is
 * not of that form, the Service has no such port, or no endpoint is ready.
 */
export async function resolveServiceAddress(conn: KubeConnection, address: string): Promise<string> {
  const m = /^([a-z0-9-]+)\.([a-z0-9-]+)(\.svc(\..+)?)?:([0-9]+)$/.exec(address);
  if (!m) throw new Error(`${address} is not <service>.<namespace>:<port>`);
  const [, svcName = "", ns = "", , , portText = ""] = m;
  const svc = await conn.api(k8s.CoreV1Api).readNamespacedService({ name: svcName, namespace: ns });
  const port = svc.spec?.ports?.find((p) => p.port === Number(portText));
  if (!port) throw new Error(`Service ${ns}/${svcName} has no port ${portText}`);
  const slices = await conn.api(k8s.DiscoveryV1Api).listNamespacedEndpointSlice({
    namespace: ns,
    labelSelector: `kubernetes.io/service-name=${svcName}`,
  });
  for (const slice of slices.items) {
    const sp = slice.ports?.find((p) => (p.name ?? "") === (port.name ?? ""));
    if (sp?.port === undefined) continue;
    for (const ep of slice.endpoints ?? []) {
      if (ep.conditions?.ready === false) continue;
      const ip = ep.addresses[0];
      if (ip) return `${ip}:${sp.port}`;
    }
  }
  throw new Error(`Service ${ns}/${svcName} has no ready endpoint for port ${portText}`);
}

/**
 * The CSI snapshot id (VolumeSnapshotContent status.snapshotHandle) of VolumeSnapshot `ns/name`:
 * GetMetadataDelta takes its base as this id, not as a name. Throws when it is not bound yet.
 */
export async function snapshotHandle(conn: KubeConnection, ns: string, name: string): Promise<string> {
  const custom = conn.api(k8s.CustomObjectsApi);
  const snap = (await custom.getNamespacedCustomObject({
    group: SNAPSHOT_GROUP,
    version: "v1",
    namespace: ns,
    plural: "volumesnapshots",
    name,
  })) as { status?: { boundVolumeSnapshotContentName?: string } };
  const contentName = snap.status?.boundVolumeSnapshotContentName;
  if (!contentName) throw new Error(`VolumeSnapshot ${ns}/${name} is not bound to a content yet`);
  const content = (await custom.getClusterCustomObject({
    group: SNAPSHOT_GROUP,
    version: "v1",
    plural: "volumesnapshotcontents",
    name: contentName,
  })) as { status?: { snapshotHandle?: string } };
  const handle = content.status?.snapshotHandle;
  if (!handle) throw new Error(`VolumeSnapshotContent ${contentName} has no snapshotHandle yet`);
  return handle;
}

export interface AllocatedQuery {
  token: string;
  namespace: string;
  snapshotName: string;
  startingOffset?: bigint;
  maxResults?: number;
}

export interface DeltaQuery {
  token: string;
  namespace: string;
  /** The base snapshot's CSI id (snapshotHandle()). */
  baseSnapshotId: string;
  targetSnapshotName: string;
  startingOffset?: bigint;
  maxResults?: number;
}

/**
 * One TLS channel to the sidecar at `dial` (`<ip>:<port>`), verifying its certificate against the
 * service's CA for the host name of the service's address (the certificate's SAN), as a client
 * that dialled that name would. Calls may run concurrently; close() ends the channel.
 */
export class SnapshotMetadataClient {
  private readonly client: grpc.Client;

  constructor(service: SnapshotMetadataServiceInfo, dial: string) {
    const host = service.address.replace(/:[0-9]+$/, "");
    this.client = new grpc.Client(dial, grpc.credentials.createSsl(Buffer.from(service.caPem)), {
      "grpc.ssl_target_name_override": host,
      "grpc.default_authority": host,
      "grpc.max_receive_message_length": 64 << 20,
    });
  }

  /** Every allocated range of a snapshot, collected from the stream; rejects with SnapshotMetadataError. */
  getMetadataAllocated(q: AllocatedQuery, timeoutMs = 60_000): Promise<MetadataStream> {
    const req: GetMetadataAllocatedRequest = create(GetMetadataAllocatedRequestSchema, {
      securityToken: q.token,
      namespace: q.namespace,
      snapshotName: q.snapshotName,
      startingOffset: q.startingOffset ?? 0n,
      maxResults: q.maxResults ?? 0,
    });
    return this.collect<GetMetadataAllocatedRequest, GetMetadataAllocatedResponse>(
      `/${SnapshotMetadata.typeName}/${SnapshotMetadata.method.getMetadataAllocated.name}`,
      (m) => Buffer.from(toBinary(GetMetadataAllocatedRequestSchema, m)),
      (b) => fromBinary(GetMetadataAllocatedResponseSchema, b),
      req,
      timeoutMs,
    );
  }

  /** Every range changed from the base snapshot to the target, collected; rejects like getMetadataAllocated. */
  getMetadataDelta(q: DeltaQuery, timeoutMs = 60_000): Promise<MetadataStream> {
    const req: GetMetadataDeltaRequest = create(GetMetadataDeltaRequestSchema, {
      securityToken: q.token,
      namespace: q.namespace,
      baseSnapshotId: q.baseSnapshotId,
      targetSnapshotName: q.targetSnapshotName,
      startingOffset: q.startingOffset ?? 0n,
      maxResults: q.maxResults ?? 0,
    });
    return this.collect<GetMetadataDeltaRequest, GetMetadataDeltaResponse>(
      `/${SnapshotMetadata.typeName}/${SnapshotMetadata.method.getMetadataDelta.name}`,
      (m) => Buffer.from(toBinary(GetMetadataDeltaRequestSchema, m)),
      (b) => fromBinary(GetMetadataDeltaResponseSchema, b),
      req,
      timeoutMs,
    );
  }

  close(): void {
    this.client.close();
  }

  private collect<I, O extends GetMetadataAllocatedResponse | GetMetadataDeltaResponse>(
    path: string,
    serialize: (m: I) => Buffer,
    deserialize: (b: Buffer) => O,
    req: I,
    timeoutMs: number,
  ): Promise<MetadataStream> {
    const call = this.client.makeServerStreamRequest(path, serialize, deserialize, req, new grpc.Metadata(), {
      deadline: Date.now() + timeoutMs,
    });
    return new Promise((resolve, reject) => {
      const out: MetadataStream = {
        blockMetadataType: BlockMetadataType.UNKNOWN,
        volumeCapacityBytes: 0n,
        ranges: [],
        messages: 0,
        largestMessage: 0,
      };
      call.on("data", (m: O) => {
        if (out.messages === 0) {
          out.blockMetadataType = m.blockMetadataType;
          out.volumeCapacityBytes = m.volumeCapacityBytes;
        }
        out.messages++;
        out.largestMessage = Math.max(out.largestMessage, m.blockMetadata.length);
        out.ranges.push(
          ...m.blockMetadata.map((b: BlockMetadata) => ({ offset: b.byteOffset, size: b.sizeBytes })),
        );
      });
      call.on("error", (e: grpc.ServiceError) => reject(new SnapshotMetadataError(e.code, e.details)));
      call.on("status", (s: grpc.StatusObject) => {
        if (s.code === grpc.status.OK) resolve(out);
      });
    });
  }
}

/**
 * The block indices (of `blockSize` bytes) the ranges cover, sorted and distinct. Throws on a range
 * that does not start and end on a block boundary: FIXED_LENGTH metadata of a cluster-granular
 * driver never has one.
 */
export function blocksOf(ranges: readonly ByteRange[], blockSize: bigint): number[] {
  const out = new Set<number>();
  for (const r of ranges) {
    if (r.offset % blockSize !== 0n || r.size % blockSize !== 0n || r.size <= 0n)
      throw new Error(`range ${r.offset}+${r.size} is not whole blocks of ${blockSize}`);
    for (let b = r.offset / blockSize; b < (r.offset + r.size) / blockSize; b++) out.add(Number(b));
  }
  return [...out].sort((a, b) => a - b);
}
