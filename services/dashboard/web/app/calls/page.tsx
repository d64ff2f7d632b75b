"use client";
// Function calls, newest first, live: state, duration, the error's type; filter by state or
// function; cancel a running one. One page at a time from the server.
import { useState } from "react";
import { ActionButton } from "@/components/ActionButton";
import { CallLink, ContainerLink } from "@/components/Links";
import { Pager } from "@/components/Pager";
import { ErrorNote, Loading, StatusPill } from "@/components/Status";
import { Table } from "@/components/Table";
import { seg } from "@/lib/api";
import { ago, ms, timeOf } from "@/lib/format";
import type { FunctionCall } from "@/lib/types";
import { about, useResource } from "@/lib/useResource";

const LIMIT = 50;
const STATES = ["", "running", "retrying", "ok", "error", "timeout", "cancelled", "failed"];
const RUNNING = new Set(["running", "retrying"]);

export default function CallsPage() {
  const [offset, setOffset] = useState(0);
  const [state, setState] = useState("");
  const [fn, setFn] = useState("");
  const { data, answer, error } = useResource<FunctionCall[]>("/api/v1/calls",
    { status: state, function: fn.trim(), limit: LIMIT, offset }, about(["call"]));
  return (
    <>
      <h1>Function calls</h1>
      <form className="filters" onSubmit={(e) => e.preventDefault()}>
        <label>state
          <select value={state} onChange={(e) => { setState(e.target.value); setOffset(0); }}>
            {STATES.map((s) => <option key={s} value={s}>{s || "any"}</option>)}
          </select>
        </label>
        <label>function
          <input value={fn} placeholder="app.name" onChange={(e) => { setFn(e.target.value); setOffset(0); }} />
        </label>
      </form>
      <ErrorNote error={error} />
      {!data && !error && <Loading what="calls" />}
      {data && (
        <>
          <Table label="function calls" rows={data} rowKey={(c) => c.call_id} empty="no calls"
            columns={[
              { title: "call", cell: (c) => <CallLink id={c.call_id} /> },
              { title: "function", cell: (c) => c.function },
              { title: "state", cell: (c) => <StatusPill status={c.state} /> },
              { title: "duration", cell: (c) => ms(c.duration_ms), className: "num" },
              { title: "attempts", cell: (c) => c.attempts ?? 1, className: "num" },
              { title: "error", cell: (c) => <span className="reason">{[c.error_type, c.reason].filter(Boolean).join(": ")}</span>, className: "wide" },
              { title: "container", cell: (c) => <ContainerLink id={c.container_id ?? ""} /> },
              { title: "started", cell: (c) => <span title={timeOf(c.started_at)}>{ago(c.started_at)}</span> },
              {
                title: "",
                cell: (c) => RUNNING.has(c.state) && (
                  <ActionButton label="cancel" danger path={`/api/calls/${seg(c.call_id)}/cancel`} confirm="Cancel this call?" />
                ),
              },
            ]} />
          <Pager offset={offset} limit={LIMIT} total={answer?.total ?? null} shown={data.length} onOffset={setOffset} />
        </>
      )}
    </>
  );
}
