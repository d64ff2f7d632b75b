// Events as rows: when, what, which aggregate, and the correlation id that opens its chain.
import Link from "next/link";
import { clockOf, shortId, timeOf } from "@/lib/format";
import type { LevEvent } from "@/lib/types";
import { ChainLink } from "./Links";
import { Table, type Column } from "./Table";

function summary(data: Record<string, unknown>): string {
  const text = JSON.stringify(data ?? {});
  return text.length > 140 ? `${text.slice(0, 140)}…` : text;
}

const COLUMNS: Column<LevEvent>[] = [
  { title: "seq", cell: (e) => e.seq, className: "num" },
  { title: "time", cell: (e) => <span title={timeOf(e.occurred_at)}>{clockOf(e.occurred_at)}</span> },
  { title: "type", cell: (e) => <strong>{e.type}</strong> },
  {
    title: "aggregate",
    cell: (e) => (
      <Link className="mono" href={`/log/?aggregate=${e.aggregate}&aggregate_id=${encodeURIComponent(e.aggregate_id)}`}>
        {e.aggregate} {shortId(e.aggregate_id)}
      </Link>
    ),
  },
  { title: "correlation", cell: (e) => <ChainLink id={e.correlation_id} /> },
  { title: "data", cell: (e) => <code className="data">{summary(e.data)}</code>, className: "wide" },
];

export function EventTable({ events, label = "events" }: { events: LevEvent[]; label?: string }) {
  return <Table rows={events} columns={COLUMNS} rowKey={(e) => e.id} label={label} empty="no events" />;
}
