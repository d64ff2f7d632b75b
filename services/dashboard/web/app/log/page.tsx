"use client";
// The event log (/log/: `/events` is the backend's SSE stream), newest first: filters (type, aggregate and its id, time window, correlation id)
// kept in the URL so a filtered view can be shared; pages back by seq. On the first page, new
// matching events appear as they happen.
import { Suspense, useState, type FormEvent } from "react";
import { useRouter, useSearchParams } from "next/navigation";
import { CursorPager } from "@/components/Pager";
import { EventTable } from "@/components/EventTable";
import { ErrorNote, Loading } from "@/components/Status";
import { EVENT_TYPES } from "@/lib/eventTypes";
import type { LevEvent } from "@/lib/types";
import { useResource } from "@/lib/useResource";

const LIMIT = 100;
const AGGREGATES = ["", "container", "deployment", "call", "image", "checkpoint", "worker", "token", "secret", "volume", "catalogue", "cluster"];
const FILTERS = ["type", "aggregate", "aggregate_id", "correlation_id", "since", "until"] as const;
type Filters = Record<(typeof FILTERS)[number], string>;

function matches(f: Filters) {
  return (e: LevEvent) =>
    (!f.type || f.type.split(",").includes(e.type)) && (!f.aggregate || e.aggregate === f.aggregate) &&
    (!f.aggregate_id || e.aggregate_id === f.aggregate_id) && (!f.correlation_id || e.correlation_id === f.correlation_id) &&
    !f.until;
}

function useFilters(): Filters {
  const params = useSearchParams();
  return Object.fromEntries(FILTERS.map((k) => [k, params?.get(k) ?? ""])) as Filters;
}

function EventsView() {
  const filters = useFilters();
  const [trail, setTrail] = useState<string[]>([]);
  const before = trail.at(-1);
  const { data, answer, error } = useResource<LevEvent[]>("/api/v1/events", { ...filters, before, limit: LIMIT },
    before ? null : matches(filters));
  return (
    <>
      <h1>Event log</h1>
      <FilterForm filters={filters} onApply={() => setTrail([])} />
      <ErrorNote error={error} />
      {!data && !error && <Loading what="events" />}
      {data && (
        <>
          <EventTable events={data} />
          <CursorPager trail={trail} nextBefore={answer?.nextBefore ?? null} onTrail={setTrail} />
        </>
      )}
    </>
  );
}

function toInputTime(iso: string): string {
  return iso ? iso.slice(0, 16) : "";
}

function FilterForm({ filters, onApply }: { filters: Filters; onApply: () => void }) {
  const router = useRouter();
  const submit = (event: FormEvent<HTMLFormElement>) => {
    event.preventDefault();
    const form = new FormData(event.currentTarget);
    const query = new URLSearchParams();
    for (const key of FILTERS) {
      let value = String(form.get(key) ?? "").trim();
      if (value && (key === "since" || key === "until")) value = new Date(`${value}Z`).toISOString();
      if (value) query.set(key, value);
    }
    onApply();
    router.push(`/log/${query.size ? `?${query}` : ""}`);
  };
  const key = FILTERS.map((k) => filters[k]).join("|"); // a new URL resets the form's fields
  return (
    <form className="filters" onSubmit={submit} key={key} aria-label="filters">
      <label>type
        <input name="type" list="event-types" defaultValue={filters.type} placeholder="any" />
        <datalist id="event-types">{EVENT_TYPES.map((t) => <option key={t} value={t} />)}</datalist>
      </label>
      <label>aggregate
        <select name="aggregate" defaultValue={filters.aggregate}>
          {AGGREGATES.map((a) => <option key={a} value={a}>{a || "any"}</option>)}
        </select>
      </label>
      <label>aggregate id<input name="aggregate_id" defaultValue={filters.aggregate_id} /></label>
      <label>correlation id<input name="correlation_id" defaultValue={filters.correlation_id} /></label>
      <label>since (UTC)<input name="since" type="datetime-local" defaultValue={toInputTime(filters.since)} /></label>
      <label>until (UTC)<input name="until" type="datetime-local" defaultValue={toInputTime(filters.until)} /></label>
      <button type="submit">filter</button>
    </form>
  );
}

export default function EventsPage() {
  return (
    <Suspense>
      <EventsView />
    </Suspense>
  );
}
