// Each cold start of the window as a dot: when it became ready (x) and how long it took (y), its
// colour its kind — a restore shows as a low dot beside the tall cold ones.
import { ms } from "@/lib/format";
import type { ColdStart } from "@/lib/stats";

const W = 320;
const H = 120;
const PAD = { left: 36, right: 6, top: 8, bottom: 18 };
const TONES: Record<string, string> = { restored: "a", "shared checkpoint": "b", cold: "c" };

export function StartTimes({ starts }: { starts: ColdStart[] }) {
  const times = starts.map((s) => new Date(s.ready_at).getTime());
  const t0 = Math.min(...times);
  const span = Math.max(1, Math.max(...times) - t0);
  const top = Math.max(1, ...starts.map((s) => s.ms));
  return (
    <figure className="chart" aria-label="cold start times">
      <figcaption>
        cold start times (request → ready)
        <span className="legend">
          {Object.entries(TONES).map(([kind, tone]) => <span key={kind} className={`key tone-${tone}`}>{kind}</span>)}
        </span>
      </figcaption>
      {starts.length === 0 ? (
        <p className="note">no container became ready in this window</p>
      ) : (
        <svg viewBox={`0 0 ${W} ${H}`} role="img" aria-label="cold start times">
          <line className="axis" x1={PAD.left} y1={H - PAD.bottom} x2={W - PAD.right} y2={H - PAD.bottom} />
          <text className="tick" x={PAD.left - 4} y={PAD.top + 4} textAnchor="end">{ms(top)}</text>
          <text className="tick" x={PAD.left - 4} y={H - PAD.bottom} textAnchor="end">0</text>
          {starts.map((s, i) => (
            <circle key={s.container_id} className={`tone-${TONES[s.kind] ?? "a"}`} r={3.5}
              cx={PAD.left + ((times[i] - t0) / span) * (W - PAD.left - PAD.right - 8) + 4}
              cy={H - PAD.bottom - (s.ms / top) * (H - PAD.top - PAD.bottom)}>
              <title>{`${s.kind}: ${ms(s.ms)}`}</title>
            </circle>
          ))}
        </svg>
      )}
    </figure>
  );
}
