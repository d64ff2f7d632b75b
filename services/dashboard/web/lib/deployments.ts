// The gateway lists every version of every deployment: the pages show each name once.
import type { Deployment } from "./types";

export interface Named {
  latest: Deployment;
  versions: Deployment[];
}

export function byName(rows: Deployment[]): Named[] {
  const found = new Map<string, Named>();
  for (const row of rows) {
    const had = found.get(row.name);
    if (!had) found.set(row.name, { latest: row, versions: [row] });
    else found.set(row.name, { latest: row.version > had.latest.version ? row : had.latest, versions: [...had.versions, row] });
  }
  return [...found.values()].sort((a, b) => a.latest.name.localeCompare(b.latest.name));
}
