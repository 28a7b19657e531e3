// Where nvmet keeps each object in configfs. One place, so the writer and its tests agree on the
// layout the kernel expects.

/** Where the nvmet module's configfs tree lives on a host with configfs mounted. */
export const NVMET_ROOT = "/sys/kernel/config/nvmet";

/** Absolute host paths of nvmet objects under `root`. Pure; names are used verbatim. */
export class NvmetPaths {
  readonly root: string;

  constructor(root: string = NVMET_ROOT) {
    this.root = root.replace(/\/+$/, "");
  }

  get subsystems(): string {
    return `${this.root}/subsystems`;
  }
  get ports(): string {
    return `${this.root}/ports`;
  }
  get hosts(): string {
    return `${this.root}/hosts`;
  }
  subsystem(nqn: string): string {
    return `${this.subsystems}/${nqn}`;
  }
  namespaces(nqn: string): string {
    return `${this.subsystem(nqn)}/namespaces`;
  }
  namespace(nqn: string, nsid: number | string): string {
    return `${this.namespaces(nqn)}/${nsid}`;
  }
  allowedHosts(nqn: string): string {
    return `${this.subsystem(nqn)}/allowed_hosts`;
  }
  allowedHost(nqn: string, hostNqn: string): string {
    return `${this.allowedHosts(nqn)}/${hostNqn}`;
  }
  host(hostNqn: string): string {
    return `${this.hosts}/${hostNqn}`;
  }
  port(id: number | string): string {
    return `${this.ports}/${id}`;
  }
  portSubsystems(id: number | string): string {
    return `${this.port(id)}/subsystems`;
  }
  portLink(id: number | string, nqn: string): string {
    return `${this.portSubsystems(id)}/${nqn}`;
  }
}
