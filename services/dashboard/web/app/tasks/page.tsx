"use client";
// Task queues: the workspace's tasks, newest first, live (state, queue, attempt, why it ended), filtered
// by state or queue, one page at a time from the server; cancel one that has not ended; and the
// schedules with their next runs and last tick.
import { useState } from "react";
import { ActionButton } from "@/components/ActionButton";
import { TaskLink } from "@/components/Links";
import { Pager } from "@/components/Pager";
import { ErrorNote, Loading, Section, StatusPill } from "@/components/Status";
import { Table } from "@/components/Table";
import { seg } from "@/lib/api";
import { ago, timeOf } from "@/lib/format";
import type { Schedule, Task, TaskPage } from "@/lib/types";
import { about, useResource } from "@/lib/useResource";

const LIMIT = 50;
const STATES = ["", "queued", "running", "retrying", "succeeded", "failed", "expired", "cancelled"];
const OPEN = new Set(["queued", "running", "retrying"]);

export default function TasksPage() {
  const [offset, setOffset] = useState(0);
  const [state, setState] = useState("");
  const [queue, setQueue] = useState("");
  const { data, error } = useResource<TaskPage>("/api/v1/tasks",
    { status: state, queue: queue.trim(), limit: LIMIT, offset }, about(["task"]));
  return (
    <>
      <h1>Tasks</h1>
      <form className="filters" onSubmit={(e) => e.preventDefault()}>
        <label>state
          <select value={state} onChange={(e) => { setState(e.target.value); setOffset(0); }}>
            {STATES.map((s) => <option key={s} value={s}>{s || "any"}</option>)}
          </select>
        </label>
        <label>queue
          <input value={queue} placeholder="name" onChange={(e) => { setQueue(e.target.value); setOffset(0); }} />
        </label>
      </form>
      <ErrorNote error={error} />
      {!data && !error && <Loading what="tasks" />}
      {data && (
        <>
          <Table label="tasks" rows={data.tasks} rowKey={(t) => t.task_id} empty="no tasks"
            columns={[
              { title: "task", cell: (t) => <TaskLink id={t.task_id} /> },
              { title: "queue", cell: (t) => t.queue },
              { title: "state", cell: (t) => <StatusPill status={t.status} /> },
              { title: "attempt", cell: (t) => t.attempt, className: "num" },
              { title: "why", cell: (t) => <span className="reason">{t.reason}</span>, className: "wide" },
              { title: "enqueued", cell: (t) => <span title={timeOf(t.enqueued_at)}>{ago(t.enqueued_at)}</span> },
              {
                title: "",
                cell: (t) => OPEN.has(t.status) && (
                  <ActionButton label="cancel" danger path={`/api/tasks/${seg(t.task_id)}/cancel`} confirm="Cancel this task?" />
                ),
              },
            ]} />
          <Pager offset={offset} limit={LIMIT} total={data.total} shown={data.tasks.length} onOffset={setOffset} />
        </>
      )}
      <Schedules />
    </>
  );
}

function Schedules() {
  const { data, error } = useResource<{ schedules: Schedule[] }>("/api/v1/schedules", {},
    about(["schedule", "deployment"]));
  return (
    <Section title="Schedules">
      <ErrorNote error={error} />
      <Table label="schedules" rows={data?.schedules ?? []} rowKey={(s) => s.name} empty="no schedules"
        columns={[
          { title: "name", cell: (s) => s.name },
          { title: "cron", cell: (s) => <code>{s.cron}</code> },
          { title: "time zone", cell: (s) => s.timezone },
          { title: "next runs", cell: (s) => s.next_runs.map((t) => timeOf(t)).join(", "), className: "wide" },
          { title: "last tick", cell: (s) => (s.last_task_id ? <TaskLink id={s.last_task_id} label={timeOf(s.last_tick)} /> : "–") },
        ]} />
    </Section>
  );
}
