// A deployment's stats (GET /api/v1/deployments/{name}/stats?minutes=60) turned into what the
// charts draw: per-minute calls and latency series, and cold starts by kind with their median time.
import type { ColdStartKind } from "@/components/ColdStartChart";
import type { Series } from "@/components/LineChart";
import { list, numberOf, pick, textOf } from "./pick";

export const KINDS = ["restored", "shared checkpoint", "cold"] as const;

export interface DeploymentStats {
  calls: Series[];
  latency: Series[];
  coldStarts: ColdStartKind[];
  notes: string[];
}

function minutesOf(raw: unknown): Record<string, unknown>[] {
  return list(raw, "per_minute", "minutes", "series", "points");
}

function atOf(row: unknown): number {
  return new Date(textOf(row, "minute", "at", "t", "start")).getTime();
}

function kindsOf(raw: unknown): ColdStartKind[] {
  const found = pick<unknown>(raw, "cold_starts", "cold_starts_by_kind");
  const summary = (kind: string, value: unknown): ColdStartKind => ({
    kind,
    count: typeof value === "number" ? value : numberOf(value, "count", "n") ?? 0,
    p50_ms: typeof value === "number" ? null : numberOf(value, "p50_ms", "median_ms", "p50"),
  });
  if (Array.isArray(found)) {
    const byKind = new Map(found.map((row) => [textOf(row, "kind"), row]));
    return KINDS.map((kind) => summary(kind, byKind.get(kind) ?? 0));
  }
  if (found && typeof found === "object") {
    return KINDS.map((kind) => summary(kind, (found as Record<string, unknown>)[kind] ?? 0));
  }
  return KINDS.map((kind) => summary(kind, 0));
}

export function toStats(raw: unknown): DeploymentStats {
  const rows = minutesOf(raw).filter((r) => Number.isFinite(atOf(r)));
  const series = (key: string[], name: string, tone: Series["tone"]): Series => ({
    name,
    tone,
    points: rows.map((r) => ({ at: atOf(r), value: numberOf(r, ...key) })),
  });
  const notes = pick<unknown>(raw, "notes", "about", "definitions");
  return {
    calls: [series(["calls", "requests", "count"], "calls/min", "a")],
    latency: [series(["p50_ms", "latency_p50_ms", "p50"], "p50", "a"), series(["p99_ms", "latency_p99_ms", "p99"], "p99", "c")],
    coldStarts: kindsOf(raw),
    notes: Array.isArray(notes) ? notes.map(String)
      : notes && typeof notes === "object" ? Object.entries(notes).map(([k, v]) => `${k}: ${v}`) : [],
  };
}
