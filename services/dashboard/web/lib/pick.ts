// Reading composed views whose field names may differ slightly between backend versions: the first
// present key wins, so a renamed field degrades to "–" instead of breaking the page.
export function pick<T = unknown>(obj: unknown, ...keys: string[]): T | undefined {
  if (!obj || typeof obj !== "object") return undefined;
  const record = obj as Record<string, unknown>;
  for (const key of keys) if (record[key] !== undefined && record[key] !== null) return record[key] as T;
  return undefined;
}

export function list<T = Record<string, unknown>>(obj: unknown, ...keys: string[]): T[] {
  const found = pick<unknown>(obj, ...keys);
  return Array.isArray(found) ? (found as T[]) : [];
}

export function numberOf(obj: unknown, ...keys: string[]): number | null {
  const found = pick<unknown>(obj, ...keys);
  return typeof found === "number" && Number.isFinite(found) ? found : null;
}

export function textOf(obj: unknown, ...keys: string[]): string {
  const found = pick<unknown>(obj, ...keys);
  return found === undefined ? "" : String(found);
}
