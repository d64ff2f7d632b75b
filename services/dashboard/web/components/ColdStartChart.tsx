// Cold starts by kind: one horizontal bar per kind (restored / shared checkpoint / cold), its length
// the count, with the median start time beside it — which kind is common and what each costs.
import { ms } from "@/lib/format";

export interface ColdStartKind {
  kind: string;
  count: number;
  p50_ms: number | null;
}

const TONES: Record<string, string> = { restored: "a", "shared checkpoint": "b", cold: "c" };

export function ColdStartChart({ kinds }: { kinds: ColdStartKind[] }) {
  const most = Math.max(1, ...kinds.map((k) => k.count));
  return (
    <figure className="chart" aria-label="cold starts by kind">
      <figcaption>cold starts by kind</figcaption>
      <svg viewBox={`0 0 320 ${kinds.length * 26 + 4}`} role="img" aria-label="cold starts by kind">
        {kinds.map((k, i) => (
          <g key={k.kind} transform={`translate(0 ${i * 26 + 2})`}>
            <text className="tick" x={0} y={15}>{k.kind}</text>
            <rect className={`bar tone-${TONES[k.kind] ?? "a"}`} x={110} y={3} height={16}
              width={Math.max(k.count ? 2 : 0, (k.count / most) * 120)} />
            <text className="tick" x={236} y={15}>{k.count} · {ms(k.p50_ms)}</text>
          </g>
        ))}
      </svg>
    </figure>
  );
}
