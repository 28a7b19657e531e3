// The NVMe-oF initiator port of the CSI node: connect to a subsystem, disconnect it, list what is
// connected, and find a namespace's block device. Production runs it on nvme-cli and sysfs
// (nvme-cli.ts); the lab runs it on the simulated fabric and loop devices (lab/sim/fabric).

/** Everything `nvme connect` needs to reach one subsystem as one host. */
export interface ConnectParams {
  readonly transport: "tcp" | "rdma";
  /** Target address as given (IPv4 dotted quad or IPv6 literal without brackets). */
  readonly address: string;
  /** Transport service id: the TCP port or RDMA CM port. */
  readonly port: number;
  /** Subsystem NQN. */
  readonly nqn: string;
  /** The host NQN the target's ACL allows; the node's persistent one. */
  readonly hostNqn: string;
  /** Seconds to keep reconnecting before giving the controller up; -1 forever. */
  readonly ctrlLossTmo?: number;
  /** Seconds between reconnect attempts. */
  readonly reconnectDelay?: number;
  /** Seconds after which I/O fails fast while reconnecting; -1 off. */
  readonly fastIoFailTmo?: number;
  /**
   * DH-HMAC-CHAP secrets (DHHC-1 form) when the target demands authentication. Never put on a
   * command line, in the environment or in a log: an initiator hands them over the way nvme-cli
   * takes them from its JSON configuration (a 0600 file) or the kernel from /dev/nvme-fabrics.
   */
  readonly dhchap?: ConnectSecrets;
  /**
   * NVMe/TCP TLS with this host's configured PSK (interchange form, NVMeTLSkey-1:...), when the
   * volume's listeners accept TLS only. Handled like the DH-HMAC-CHAP secrets: never argv,
   * environment or log.
   */
  readonly tls?: { readonly psk: string };
}

/** The host's DH-HMAC-CHAP secret and, for bidirectional authentication, the controller's. */
export interface ConnectSecrets {
  /** The host's secret; the target checks the host's response with it. */
  readonly secret: string;
  /** The controller's secret: given, the host also checks the controller (bidirectional). */
  readonly ctrlSecret?: string;
}

/** One controller (path) of a connected subsystem, as nvme list-subsys reports it. */
export interface ConnectedPath {
  /** Controller name, e.g. "nvme3". */
  readonly name: string;
  /** "tcp", "rdma", "pcie", "loop", "fc". */
  readonly transport: string;
  readonly traddr: string | undefined;
  readonly trsvcid: string | undefined;
  /** Kernel controller state: "live", "connecting", "resetting", "deleting", "dead", "new". */
  readonly state: string;
}

/** A subsystem with at least one controller on this host. */
export interface ConnectedSubsystem {
  readonly nqn: string;
  /** The host NQN its controllers connected with. */
  readonly hostNqn: string;
  /** Subsystem name, e.g. "nvme-subsys3". */
  readonly name: string;
  readonly paths: readonly ConnectedPath[];
}

/**
 * The initiator. Every method is safe to repeat and to call concurrently for different NQNs;
 * callers serialise calls for one NQN. Failures are StorageError: "unavailable" when the target
 * cannot be reached or refuses the host (retrying later may work), "timeout" when a command
 * outlived its deadline, "internal" for output that cannot be understood.
 */
export interface NvmeInitiator {
  /**
   * Connects `params.hostNqn` to subsystem `params.nqn` at the given address. Idempotent: resolves
   * at once when a controller of that subsystem at that address already exists.
   */
  connect(params: ConnectParams): Promise<void>;
  /**
   * Disconnects every controller of subsystem `nqn` and resolves once none remains. Resolves
   * without doing anything when none exists. Rejects when a controller is still there afterwards.
   */
  disconnect(nqn: string): Promise<void>;
  /** Subsystems with controllers on this host, fabric and local alike. */
  list(): Promise<ConnectedSubsystem[]>;
  /**
   * The block device (e.g. "/dev/nvme3n1") of the namespace of subsystem `nqn` whose UUID or
   * NGUID is `namespaceId`; without `namespaceId`, of its only namespace. Undefined while the
   * subsystem or namespace is not (yet) visible. Rejects with "precondition" when no id is given
   * and the subsystem has several namespaces: guessing would risk another volume's data.
   */
  findNamespaceDevice(nqn: string, namespaceId?: string): Promise<string | undefined>;
  /**
   * Asks every controller of `nqn` to rescan its namespaces, so a namespace grown on the target
   * shows its new size. Resolves once the rescan was requested; the size may change a moment
   * later. Rejects with "not-found" when `nqn` has no controller.
   */
  rescan(nqn: string): Promise<void>;
}

/**
 * The 32 lowercase hex digits of a namespace UUID or NGUID, however it is written (with or without
 * dashes, any case), or undefined when `id` is not 32 hex digits. sysfs prints both as UUIDs.
 */
export function namespaceIdDigits(id: string): string | undefined {
  const hex = id.replaceAll("-", "").toLowerCase();
  return /^[0-9a-f]{32}$/.test(hex) ? hex : undefined;
}
