// A cold start as a waterfall: requested → placed → image mounted → restored or started → ready →
// first answer, each phase a horizontal bar from where the previous one ended, as long as it took.
import { ms, timeOf } from "@/lib/format";
import type { Waterfall as WaterfallData } from "@/lib/types";

export function Waterfall({ waterfall }: { waterfall: WaterfallData }) {
  const phases = waterfall.phases ?? [];
  const total = phases.reduce((sum, p) => sum + (p.ms ?? 0), 0);
  let start = 0;
  return (
    <div className="waterfall" data-testid="waterfall">
      <p className="waterfall-head">
        <strong>{waterfall.kind ?? "unknown"}</strong> start, {ms(total)} from request to the last phase
      </p>
      <ol>
        {phases.map((phase) => {
          const width = total > 0 ? ((phase.ms ?? 0) / total) * 100 : 0;
          const left = total > 0 ? (start / total) * 100 : 0;
          start += phase.ms ?? 0;
          return (
            <li key={phase.name} className="phase" title={timeOf(phase.at)}>
              <span className="phase-name">{phase.name}</span>
              <span className="phase-track">
                <span className="phase-bar" style={{ left: `${left}%`, width: `${Math.max(width, 0.6)}%` }} />
              </span>
              <span className="phase-ms">{phase.ms === null ? "" : `+${ms(phase.ms)}`}</span>
            </li>
          );
        })}
      </ol>
      {waterfall.estimate && <Estimate estimate={waterfall.estimate} />}
    </div>
  );
}

function Estimate({ estimate }: { estimate: Record<string, unknown> }) {
  return (
    <details className="estimate" open>
      <summary>the cost model's estimate</summary>
      <dl className="facts">
        {Object.entries(estimate).map(([key, value]) => (
          <div key={key}>
            <dt>{key}</dt>
            <dd>{typeof value === "number" ? value.toLocaleString() : JSON.stringify(value)}</dd>
          </div>
        ))}
      </dl>
    </details>
  );
}
