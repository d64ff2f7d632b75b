// A deployment's stats (the gateway's GET /api/v1/deployments/{name}/stats?minutes=60) turned into
// what the charts draw: per-minute calls and latency series, cold starts by kind with their median,
// and each cold start's time. The answer's `notes` say what each number measures; the page shows them.
import type { ColdStartKind } from "@/components/ColdStartChart";
import type { Series } from "@/components/LineChart";

export const KINDS = ["restored", "shared checkpoint", "cold"] as const;

interface Minute {
  minute: string;
  calls: number;
  errors: number;
  p50_ms: number | null;
  p99_ms: number | null;
  queued_peak?: number;
}

export interface ColdStart {
  container_id: string;
  kind: string;
  requested_at: string;
  ready_at: string;
  ms: number;
}

export interface RawStats {
  deployment: string;
  minutes: number;
  since: string;
  until: string;
  calls: Minute[];
  cold_starts: ColdStart[];
  cold_start_summary: Record<string, { count: number; p50_ms: number | null; max_ms: number | null }>;
  notes: Record<string, string>;
}

export interface DeploymentStats {
  calls: Series[];
  latency: Series[];
  queue: Series[];
  kinds: ColdStartKind[];
  starts: ColdStart[];
  notes: string[];
}

export function toStats(raw: RawStats): DeploymentStats {
  const minutes = raw.calls ?? [];
  const series = (name: string, tone: Series["tone"], value: (m: Minute) => number | null): Series => ({
    name,
    tone,
    points: minutes.map((m) => ({ at: new Date(m.minute).getTime(), value: value(m) })),
  });
  return {
    calls: [series("calls", "a", (m) => m.calls), series("errors", "c", (m) => m.errors)],
    latency: [series("p50", "a", (m) => m.p50_ms), series("p99", "c", (m) => m.p99_ms)],
    queue: [series("waiting", "b", (m) => m.queued_peak ?? 0)],
    kinds: KINDS.map((kind) => ({
      kind,
      count: raw.cold_start_summary?.[kind]?.count ?? 0,
      p50_ms: raw.cold_start_summary?.[kind]?.p50_ms ?? null,
    })),
    starts: raw.cold_starts ?? [],
    notes: Object.entries(raw.notes ?? {}).map(([k, v]) => `${k}: ${v}`),
  };
}
