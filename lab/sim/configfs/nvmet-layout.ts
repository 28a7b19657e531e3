// The shape of nvmet's configfs tree, written out from drivers/nvme/target/configfs.c: which
// directories are items a user makes, which are default groups the kernel makes with them, and
// which groups accept symlinks. Paths here are segments below the nvmet directory.

/** Directories a user creates with mkdir (the root is the module's own). */
export type ItemKind = "root" | "subsystem" | "namespace" | "port" | "host" | "referral" | "ana_group";

/** Directories the kernel creates together with their item; users may not remove them. */
export type GroupKind =
  | "subsystems"
  | "ports"
  | "hosts"
  | "namespaces"
  | "allowed_hosts"
  | "port_subsystems"
  | "referrals"
  | "ana_groups";

/** What mkdir inside each group creates; groups missing here only hold symlinks. */
export const MAKES: Partial<Record<GroupKind, ItemKind>> = {
  subsystems: "subsystem",
  ports: "port",
  hosts: "host",
  namespaces: "namespace",
  referrals: "referral",
  ana_groups: "ana_group",
};

/** Which item kind a symlink inside each link-holding group must point to. */
export const LINKS_TO: Partial<Record<GroupKind, ItemKind>> = {
  allowed_hosts: "host",
  port_subsystems: "subsystem",
};

/** Default groups each item gets at mkdir, with the items the kernel puts in them. */
export const DEFAULT_GROUPS: Partial<Record<ItemKind, readonly string[]>> = {
  root: ["subsystems", "ports", "hosts"],
  subsystem: ["namespaces", "allowed_hosts"],
  port: ["subsystems", "referrals", "ana_groups"],
};

/** The item kind a directory at `s` is (or would be), if any. */
export function itemKind(s: readonly string[]): ItemKind | undefined {
  if (s.length === 0) return "root";
  if (s.length === 2 && s[0] === "subsystems") return "subsystem";
  if (s.length === 2 && s[0] === "ports") return "port";
  if (s.length === 2 && s[0] === "hosts") return "host";
  if (s.length === 4 && s[0] === "subsystems" && s[2] === "namespaces") return "namespace";
  if (s.length === 4 && s[0] === "ports" && s[2] === "referrals") return "referral";
  if (s.length === 4 && s[0] === "ports" && s[2] === "ana_groups") return "ana_group";
  return undefined;
}

/** The default group a directory at `s` is (or would be), if any. */
export function groupKind(s: readonly string[]): GroupKind | undefined {
  if (s.length === 1 && (s[0] === "subsystems" || s[0] === "ports" || s[0] === "hosts")) return s[0];
  if (s.length === 3 && s[0] === "subsystems" && s[2] === "namespaces") return "namespaces";
  if (s.length === 3 && s[0] === "subsystems" && s[2] === "allowed_hosts") return "allowed_hosts";
  if (s.length === 3 && s[0] === "ports" && s[2] === "subsystems") return "port_subsystems";
  if (s.length === 3 && s[0] === "ports" && s[2] === "referrals") return "referrals";
  if (s.length === 3 && s[0] === "ports" && s[2] === "ana_groups") return "ana_groups";
  return undefined;
}

/** ANA group 1 is a default group of every port: present from mkdir, never removable. */
export function isDefaultAnaGroup(s: readonly string[]): boolean {
  return itemKind(s) === "ana_group" && s[3] === "1";
}
