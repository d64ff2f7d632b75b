// A small line chart in SVG, drawn here (no chart library): a few series over time, the y axis from
// zero to the largest value, gaps where a minute has no value.
import { clockOf } from "@/lib/format";

export interface Point {
  at: number; // epoch ms
  value: number | null;
}

export interface Series {
  name: string;
  points: Point[];
  tone: "a" | "b" | "c";
}

const W = 320;
const H = 120;
const PAD = { left: 36, right: 6, top: 8, bottom: 18 };

function pathOf(points: Point[], x: (at: number) => number, y: (v: number) => number): string {
  let d = "";
  let pen = false;
  for (const p of points) {
    if (p.value === null || !Number.isFinite(p.value)) {
      pen = false;
      continue;
    }
    d += `${pen ? "L" : "M"}${x(p.at).toFixed(1)},${y(p.value).toFixed(1)}`;
    pen = true;
  }
  return d;
}

export function LineChart({ title, series, unit }: { title: string; series: Series[]; unit: string }) {
  const all = series.flatMap((s) => s.points);
  const times = all.map((p) => p.at);
  const t0 = Math.min(...times);
  const t1 = Math.max(...times);
  const top = Math.max(1, ...all.map((p) => p.value ?? 0));
  const x = (at: number) => PAD.left + ((at - t0) / Math.max(1, t1 - t0)) * (W - PAD.left - PAD.right);
  const y = (v: number) => H - PAD.bottom - (v / top) * (H - PAD.top - PAD.bottom);
  return (
    <figure className="chart" aria-label={title}>
      <figcaption>
        {title}
        <span className="legend">
          {series.map((s) => <span key={s.name} className={`key tone-${s.tone}`}>{s.name}</span>)}
        </span>
      </figcaption>
      {all.length === 0 ? (
        <p className="note">no data in this window</p>
      ) : (
        <svg viewBox={`0 0 ${W} ${H}`} role="img" aria-label={title} preserveAspectRatio="none">
          <line className="axis" x1={PAD.left} y1={H - PAD.bottom} x2={W - PAD.right} y2={H - PAD.bottom} />
          <line className="grid" x1={PAD.left} y1={PAD.top} x2={W - PAD.right} y2={PAD.top} />
          <text className="tick" x={PAD.left - 4} y={PAD.top + 4} textAnchor="end">{fmt(top)}{unit}</text>
          <text className="tick" x={PAD.left - 4} y={H - PAD.bottom} textAnchor="end">0</text>
          <text className="tick" x={PAD.left} y={H - 4}>{clockOf(new Date(t0).toISOString()).slice(0, 5)}</text>
          <text className="tick" x={W - PAD.right} y={H - 4} textAnchor="end">
            {clockOf(new Date(t1).toISOString()).slice(0, 5)}
          </text>
          {series.map((s) => <path key={s.name} className={`line tone-${s.tone}`} d={pathOf(s.points, x, y)} />)}
        </svg>
      )}
    </figure>
  );
}

function fmt(v: number): string {
  return v >= 1000 ? `${(v / 1000).toFixed(1)}k` : v >= 10 ? v.toFixed(0) : v.toFixed(1);
}
