// One correlation id's events as a tree (by causation) over time: each row is an event, indented
// under the event that caused it, with a dot on a shared time axis and its offset from the first.
import Link from "next/link";
import { ms, shortId, timeOf } from "@/lib/format";
import type { ChainNode, LevEvent } from "@/lib/types";

interface Row {
  event: LevEvent;
  depth: number;
}

function flatten(nodes: ChainNode[], depth = 0, out: Row[] = []): Row[] {
  const byTime = [...nodes].sort((a, b) => a.event.occurred_at.localeCompare(b.event.occurred_at));
  for (const node of byTime) {
    out.push({ event: node.event, depth });
    flatten(node.children ?? [], depth + 1, out);
  }
  return out;
}

export function ChainTree({ roots }: { roots: ChainNode[] }) {
  const rows = flatten(roots);
  const times = rows.map((r) => new Date(r.event.occurred_at).getTime());
  const t0 = Math.min(...times);
  const span = Math.max(1, Math.max(...times) - t0);
  return (
    <ol className="chain" data-testid="chain">
      {rows.map(({ event, depth }, i) => {
        const offset = times[i] - t0;
        return (
          <li key={event.id} className="chain-row">
            <span className="chain-event" style={{ paddingLeft: `${depth * 14}px` }}>
              {depth > 0 && <span className="chain-elbow" aria-hidden>└</span>}
              <strong>{event.type}</strong>{" "}
              <Link className="mono quiet" href={`/log/?aggregate=${event.aggregate}&aggregate_id=${encodeURIComponent(event.aggregate_id)}`}>
                {event.aggregate} {shortId(event.aggregate_id)}
              </Link>
            </span>
            <span className="chain-track" title={timeOf(event.occurred_at)}>
              <span className="chain-dot" style={{ left: `${(offset / span) * 100}%` }} />
            </span>
            <span className="chain-ms">+{ms(offset)}</span>
          </li>
        );
      })}
    </ol>
  );
}
