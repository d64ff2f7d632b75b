"use client";
// One task: its state, attempt and queue, its result or its error (with the remote traceback), the
// output its run printed (its log), its events, and cancel while it has not ended.
import { Suspense, type ReactNode } from "react";
import { ActionButton } from "@/components/ActionButton";
import { EventTable } from "@/components/EventTable";
import { ErrorNote, Loading, NotFound, Section, StatusPill } from "@/components/Status";
import { seg } from "@/lib/api";
import { ms, timeOf } from "@/lib/format";
import type { LevEvent, TaskDetail } from "@/lib/types";
import { about, useResource } from "@/lib/useResource";
import { useQueryParam } from "@/lib/useQueryParam";

const OPEN = new Set(["queued", "running", "retrying"]);

function TaskView() {
  const id = useQueryParam("id");
  const mine = about(["task"], id);
  const { data: t, error, notFound } = useResource<TaskDetail>(id ? `/api/v1/tasks/${seg(id)}` : null, {}, mine);
  const events = useResource<LevEvent[]>(id ? "/api/v1/events" : null, { aggregate: "task", aggregate_id: id, limit: 100 }, mine);
  if (!id || notFound) return <NotFound what={id ? `Task ${id}` : "A task without an id"} />;
  if (error) return <ErrorNote error={error} />;
  if (!t) return <Loading what="the task" />;
  const facts: [string, ReactNode][] = [
    ["queue", t.queue],
    ["function", t.function],
    ["attempt", `${t.attempt} (retries ${t.retries})`],
    ["enqueued", timeOf(new Date(t.enqueued_at * 1000).toISOString())],
    ["duration", ms(t.duration_ms ?? null)],
    ["ttl", t.ttl ? `${t.ttl} s` : "none"],
  ];
  if (t.tick) facts.push(["schedule tick", timeOf(t.tick)]);
  return (
    <>
      <header className="page-head">
        <h1 className="mono">task {t.task_id}</h1>
        <StatusPill status={t.status} />
        {OPEN.has(t.status) && (
          <ActionButton label="cancel" danger path={`/api/tasks/${seg(t.task_id)}/cancel`} confirm="Cancel this task?" />
        )}
      </header>
      <dl className="facts card">
        {facts.map(([k, v]) => <div key={k}><dt>{k}</dt><dd>{v}</dd></div>)}
      </dl>
      {t.result !== undefined && (
        <Section title="Result">
          <pre data-testid="task-result">{JSON.stringify(t.result, null, 2)}</pre>
        </Section>
      )}
      {t.error && (
        <Section title="Error">
          <p><strong>{t.error.type || t.error.outcome}</strong> {t.error.reason}</p>
          {t.error.traceback && <pre className="traceback" data-testid="traceback">{t.error.traceback}</pre>}
        </Section>
      )}
      {t.output && (
        <Section title="Output">
          <div className="logs"><pre data-testid="task-output">{t.output}</pre></div>
        </Section>
      )}
      <Section title="Events">
        {events.data ? <EventTable events={events.data} label="task events" /> : <Loading what="events" />}
      </Section>
    </>
  );
}

export default function TaskPage() {
  return (
    <Suspense>
      <TaskView />
    </Suspense>
  );
}
