"use client";
// One function call: its state and timing, the error with the remote traceback when one was kept,
// its events, and cancel while it runs.
import { Suspense, type ReactNode } from "react";
import { ActionButton } from "@/components/ActionButton";
import { EventTable } from "@/components/EventTable";
import { ChainLink, ContainerLink } from "@/components/Links";
import { ErrorNote, Loading, NotFound, Section, StatusPill } from "@/components/Status";
import { seg } from "@/lib/api";
import { ms, timeOf } from "@/lib/format";
import type { FunctionCall, LevEvent } from "@/lib/types";
import { about, useResource } from "@/lib/useResource";
import { useQueryParam } from "@/lib/useQueryParam";

const RUNNING = new Set(["running", "retrying"]);

function CallView() {
  const id = useQueryParam("id");
  const mine = about(["call"], id);
  const { data: c, error, notFound } = useResource<FunctionCall>(id ? `/api/v1/calls/${seg(id)}` : null, {}, mine);
  const events = useResource<LevEvent[]>(id ? "/api/v1/events" : null, { aggregate: "call", aggregate_id: id, limit: 100 }, mine);
  if (!id || notFound) return <NotFound what={id ? `Call ${id}` : "A call without an id"} />;
  if (error) return <ErrorNote error={error} />;
  if (!c) return <Loading what="the call" />;
  const facts: [string, ReactNode][] = [
    ["function", c.function],
    ["duration", ms(c.duration_ms)],
    ["attempts", c.attempts ?? 1],
    ["container", <ContainerLink key="c" id={c.container_id ?? ""} />],
    ["started", timeOf(c.started_at)],
    ["finished", timeOf(c.finished_at)],
    ["correlation", <ChainLink key="k" id={c.correlation_id ?? ""} />],
  ];
  return (
    <>
      <header className="page-head">
        <h1 className="mono">call {c.call_id}</h1>
        <StatusPill status={c.state} />
        {RUNNING.has(c.state) && (
          <ActionButton label="cancel" danger path={`/api/calls/${seg(c.call_id)}/cancel`} confirm="Cancel this call?" />
        )}
      </header>
      <dl className="facts card">
        {facts.map(([k, v]) => <div key={k}><dt>{k}</dt><dd>{v}</dd></div>)}
      </dl>
      {(c.error_type || c.reason || c.traceback) && (
        <Section title="Error">
          <p><strong>{c.error_type}</strong> {c.error_message || c.reason}</p>
          {c.traceback && <pre className="traceback" data-testid="traceback">{c.traceback}</pre>}
        </Section>
      )}
      <Section title="Events">
        {events.data ? <EventTable events={events.data} label="call events" /> : <Loading what="events" />}
      </Section>
    </>
  );
}

export default function CallPage() {
  return (
    <Suspense>
      <CallView />
    </Suspense>
  );
}
