// mkfsOptions: what the allow-list lets through per filesystem, and what it refuses and says.
import { expect, test } from "bun:test";
import { type MkfsFsType, parseMkfsOptions } from "./mkfs-options.ts";

const accepted: [MkfsFsType, string, string[]][] = [
  ["ext4", "", []],
  ["ext4", "  -b 4096   -i 65536 ", ["-b", "4096", "-i", "65536"]],
  ["ext4", "-E lazy_itable_init=0,nodiscard,stride=16", ["-E", "lazy_itable_init=0,nodiscard,stride=16"]],
  [
    "ext4",
    "-O ^metadata_csum,64bit -m 5 -J size=64",
    ["-O", "^metadata_csum,64bit", "-m", "5", "-J", "size=64"],
  ],
  [
    "xfs",
    "-K -m reflink=0,bigtime=1 -d su=64k,sw=4",
    ["-K", "-m", "reflink=0,bigtime=1", "-d", "su=64k,sw=4"],
  ],
  ["xfs", "-i size=512 -b size=4096", ["-i", "size=512", "-b", "size=4096"]],
];
for (const [fs, raw, want] of accepted) {
  test(`${fs} accepts ${JSON.stringify(raw)}`, () => {
    expect(parseMkfsOptions(raw, fs)).toEqual(want);
  });
}

const refused: [MkfsFsType, string, string][] = [
  ["ext4", "-F", 'option "-F" is not allowed'],
  ["xfs", "-f", 'option "-f" is not allowed'],
  ["ext4", "-b 4096 -b 1024", "option -b is given twice"],
  ["ext4", "-b", "option -b needs a value"],
  ["ext4", "-b 3000", 'value "3000" of -b is not allowed'],
  ["ext4", "-E root_owner=0:0", 'value "root_owner=0:0" of -E'],
  ["ext4", "-E nodiscard=1", 'value "nodiscard=1" of -E'],
  ["ext4", "-E stride=4,stride=8", "of -E is not allowed"],
  ["ext4", "-O encrypt", 'value "encrypt" of -O'],
  ["ext4", "-d /etc", 'option "-d" is not allowed'],
  ["ext4", "/dev/sda", 'option "/dev/sda" is not allowed'],
  ["xfs", "-K -b 4096", 'value "4096" of -b'],
  ["xfs", "-b size=3000", 'value "size=3000" of -b'],
  ["xfs", "-p /etc/protofile", 'option "-p" is not allowed'],
  ["xfs", "-m reflink=2", "of -m is not allowed"],
  ["ext4", "-K", 'option "-K" is not allowed'],
];
for (const [fs, raw, says] of refused) {
  test(`${fs} refuses ${JSON.stringify(raw)}`, () => {
    expect(() => parseMkfsOptions(raw, fs)).toThrow(says);
    expect(() => parseMkfsOptions(raw, fs)).toThrow(`mkfsOptions for ${fs}`);
  });
}
