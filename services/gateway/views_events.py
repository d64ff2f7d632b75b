"""The gateway's index of the log (`gateway.events`) and its list of function calls (`gateway.function_calls`).

`events`: one row per event a workspace may read (event_rules.audience), with the envelope's fields
and the event's data (upcast, redacted), so `GET /api/v1/events` pages through a workspace's history
by sequence without reading the log. Platform events no workspace reads are not kept. The audience of
a worker's event depends on the cluster it was provisioned on, read from this table's own
WorkerProvisioned row (not from the clusters projection, which applies on its own schedule): a
rebuild from sequence 1 gives the same rows.

`function_calls`: one row per call from the FunctionCall* events the gateway itself appends: its
state (running | retrying | ok | error | timeout | cancelled | failed), attempts and total time.
"""

from __future__ import annotations

import json

from levers9.contracts import Message, subjects
from levers9.contracts import events as E
from levers9.runtime.projection import BatchedProjection
from levers9.runtime.views import occurred

from .event_rules import EVERYONE, audience, event_data


class EventsView(BatchedProjection):
    name = "events"
    filter_subjects = (f"{subjects.ROOT}.>",)
    tables = ("events",)

    def ddl(self, schema: str) -> list[str]:
        return [f"""CREATE TABLE IF NOT EXISTS {schema}.events (
            seq bigint PRIMARY KEY, id text NOT NULL, type text NOT NULL, version int NOT NULL,
            occurred_at timestamptz NOT NULL, workspace text NOT NULL, audience text NOT NULL,
            aggregate text NOT NULL, aggregate_id text NOT NULL, correlation_id text NOT NULL,
            causation_id text, data jsonb NOT NULL)""",
                f"CREATE INDEX IF NOT EXISTS events_seq ON {schema}.events (audience, seq)",
                f"CREATE INDEX IF NOT EXISTS events_correlation ON {schema}.events (audience, correlation_id, seq)",
                f"CREATE INDEX IF NOT EXISTS events_aggregate ON {schema}.events (audience, aggregate, aggregate_id, seq)",
                f"CREATE INDEX IF NOT EXISTS events_type_time ON {schema}.events (audience, type, occurred_at)",
                f"""CREATE INDEX IF NOT EXISTS events_provisioned ON {schema}.events (aggregate_id, seq)
                    WHERE type = 'WorkerProvisioned'"""]

    def statements(self, schema: str, msg: Message, seq: int) -> list[tuple[str, tuple]]:
        env, subject = msg.envelope, subjects.parse(msg.subject)
        data = event_data(msg)
        who = audience(env.workspace, subject.aggregate, env.type, data)
        if not who:
            return []
        # a worker's later events are its cluster's when its last WorkerProvisioned named one
        sql = f"""INSERT INTO {schema}.events (seq, id, type, version, occurred_at, workspace, audience, aggregate,
                      aggregate_id, correlation_id, causation_id, data)
                  VALUES ($1, $2, $3, $4, $5, $6, CASE WHEN $7::text = '{EVERYONE}' THEN COALESCE((
                      SELECT 'cluster:' || NULLIF(p.data->>'cluster', '') FROM {schema}.events p
                      WHERE p.type = 'WorkerProvisioned' AND p.aggregate_id = $9 ORDER BY p.seq DESC LIMIT 1),
                      '{EVERYONE}') ELSE $7::text END, $8, $9, $10, $11, $12::jsonb)
                  ON CONFLICT (seq) DO NOTHING"""
        return [(sql, (seq, env.id, env.type, type(msg.event).VERSION, occurred(msg), env.workspace, who,
                       subject.aggregate, subject.aggregate_id, env.correlation_id, env.causation_id,
                       json.dumps(data)))]


CALL_STATES = ("running", "retrying", "ok", "error", "timeout", "cancelled", "failed")


class CallsView(BatchedProjection):
    name = "function_calls"
    filter_subjects = (subjects.filter_subject(aggregate="call"),)
    tables = ("function_calls",)

    def ddl(self, schema: str) -> list[str]:
        return [f"""CREATE TABLE IF NOT EXISTS {schema}.function_calls (
            workspace text NOT NULL, call_id text NOT NULL, deployment_id text NOT NULL, function text NOT NULL,
            token_id text NOT NULL DEFAULT '', mode text NOT NULL DEFAULT '', session_id text NOT NULL DEFAULT '',
            container_id text NOT NULL DEFAULT '', attempts int NOT NULL DEFAULT 0, state text NOT NULL,
            error_type text NOT NULL DEFAULT '', reason text NOT NULL DEFAULT '',
            duration_ms double precision NOT NULL DEFAULT 0, started_at timestamptz NOT NULL,
            finished_at timestamptz, correlation_id text NOT NULL, last_seq bigint NOT NULL,
            PRIMARY KEY (workspace, call_id))""",
                f"CREATE INDEX IF NOT EXISTS calls_newest ON {schema}.function_calls (workspace, started_at, call_id)",
                f"CREATE INDEX IF NOT EXISTS calls_state ON {schema}.function_calls (workspace, state, started_at)"]

    def statements(self, schema: str, msg: Message, seq: int) -> list[tuple[str, tuple]]:
        ev, env, at = msg.event, msg.envelope, occurred(msg)
        t = f"{schema}.function_calls"
        if isinstance(ev, E.FunctionCallStarted):
            return [(f"""INSERT INTO {t} (workspace, call_id, deployment_id, function, token_id, mode, session_id,
                             container_id, attempts, state, started_at, correlation_id, last_seq)
                         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 'running', $10, $11, $12)
                         ON CONFLICT (workspace, call_id) DO UPDATE SET state = 'running', token_id = $5, mode = $6,
                             session_id = $7, container_id = $8, attempts = GREATEST({t}.attempts, $9),
                             finished_at = NULL, last_seq = $12""",
                     (env.workspace, ev.call_id, ev.deployment_id, ev.function, ev.token_id, ev.mode, ev.session_id,
                      ev.container_id, ev.attempt, at, env.correlation_id, seq))]
        if isinstance(ev, E.FunctionCallFinished):
            # an attempt that found no sandbox has no Started: the call began duration_ms before this
            return [(f"""INSERT INTO {t} (workspace, call_id, deployment_id, function, attempts, state, error_type,
                             reason, duration_ms, started_at, finished_at, correlation_id, last_seq)
                         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9::float8,
                             $10::timestamptz - make_interval(secs => $9::float8 / 1000),
                             CASE WHEN $11::boolean THEN NULL ELSE $10::timestamptz END, $12, $13)
                         ON CONFLICT (workspace, call_id) DO UPDATE SET state = $6, error_type = $7, reason = $8,
                             duration_ms = {t}.duration_ms + $9::float8, attempts = GREATEST({t}.attempts, $5),
                             finished_at = EXCLUDED.finished_at, last_seq = $13""",
                     (env.workspace, ev.call_id, ev.deployment_id, ev.function, ev.attempt,
                      "retrying" if ev.retrying else ev.outcome, ev.error_type, ev.reason, float(ev.duration_ms), at,
                      ev.retrying, env.correlation_id, seq))]
        return []
