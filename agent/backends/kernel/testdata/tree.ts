// Test support: a directory tree as sorted lines (directories, file contents, symlink targets), so a
// test can assert everything a writer left behind in one expectation.
import { lstat, readdir, readFile, readlink } from "node:fs/promises";
import { join } from "node:path";

/**
 * Every entry below `root + under`, relative to it, as "dir/", "file = <JSON content>" or
 * "link -> <target>". Absolute link targets inside `root` are shown without it (as the host path
 * the writer meant). `mask` replaces the content of the named files (random values) with "<any>".
 */
export async function listTree(root: string, under: string, mask: readonly string[] = []): Promise<string[]> {
  const base = join(root, under);
  const out: string[] = [];
  const walk = async (rel: string) => {
    for (const name of (await readdir(join(base, rel))).sort()) {
      const r = rel ? `${rel}/${name}` : name;
      const st = await lstat(join(base, r));
      if (st.isSymbolicLink()) {
        const t = await readlink(join(base, r));
        out.push(`${r} -> ${t.startsWith(`${root}/`) ? t.slice(root.length) : t}`);
      } else if (st.isDirectory()) {
        out.push(`${r}/`);
        await walk(r);
      } else {
        const content = mask.includes(name) ? "<any>" : await readFile(join(base, r), "utf8");
        out.push(`${r} = ${JSON.stringify(content)}`);
      }
    }
  };
  await walk("");
  return out;
}
