"""Read models several services keep, each in its own schema: the code is shared, the tables are not.

Every row carries `version` (the number of events of its aggregate applied to it), which makes a
double apply visible: it would be one more than the number of events in the log.
"""

from __future__ import annotations

import datetime as dt
import json

import asyncpg
import msgspec

from levers9.contracts import SYSTEM_WORKSPACE, Message, subjects
from levers9.contracts import events as E

from .projection import BatchedProjection, Projection


def occurred(msg: Message) -> dt.datetime:
    return dt.datetime.fromisoformat(msg.envelope.occurred_at.replace("Z", "+00:00"))


CONTAINER_STATUS = {
    "ContainerRequested": "requested", "ContainerScheduled": "scheduled", "PlacementDeferred": "pending",
    "ContainerStarted": "starting", "ContainerReady": "ready", "ContainerStopRequested": "stopping",
    "ContainerStopped": "stopped", "ContainerFailed": "failed",
}
ENDED = ("stopped", "failed")


def next_status(current: str, status: str) -> str:
    """A container's status after an event's: a stop asked for once it has ended (a request that
    crossed its stop, as `levers9 containers stop` racing a scale-down) leaves it ended; only a new
    ContainerRequested starts it again. The same rule as the projection's SQL."""
    return current if status == "stopping" and current in ENDED else status


class ContainersView(BatchedProjection):
    name = "containers"
    filter_subjects = (subjects.filter_subject(aggregate="container"),)
    tables = ("containers",)

    def ddl(self, schema: str) -> list[str]:
        return [f"""CREATE TABLE IF NOT EXISTS {schema}.containers (
            workspace text NOT NULL, container_id text NOT NULL, deployment_id text NOT NULL DEFAULT '',
            status text NOT NULL, worker_id text NOT NULL DEFAULT '', address text NOT NULL DEFAULT '',
            cpu_millicores int NOT NULL DEFAULT 0, memory_mib int NOT NULL DEFAULT 0,
            gpu text[] NOT NULL DEFAULT '{{}}', gpu_count int NOT NULL DEFAULT 0, pool text NOT NULL DEFAULT '',
            checkpoint_id text NOT NULL DEFAULT '', reason text NOT NULL DEFAULT '',
            exit_code int, requested_at timestamptz, updated_at timestamptz NOT NULL,
            correlation_id text NOT NULL, version int NOT NULL DEFAULT 0, last_seq bigint NOT NULL DEFAULT 0,
            attempt int NOT NULL DEFAULT 1, excluded_workers text[] NOT NULL DEFAULT '{{}}',
            deployment_version int NOT NULL DEFAULT 0, ready_at timestamptz,
            note text NOT NULL DEFAULT '', restored_from text NOT NULL DEFAULT '',
            accelerator text NOT NULL DEFAULT '', checkpoint_to_restore text NOT NULL DEFAULT '',
            request jsonb, PRIMARY KEY (workspace, container_id))""",
                f"ALTER TABLE {schema}.containers ADD COLUMN IF NOT EXISTS request jsonb",
                f"CREATE INDEX IF NOT EXISTS containers_status ON {schema}.containers (status)"]

    def statements(self, schema: str, msg: Message, seq: int) -> list[tuple[str, tuple]]:
        ev, env, at = msg.event, msg.envelope, occurred(msg)
        container_id = ev.aggregate_id  # every event here is of a container
        out: list[tuple[str, tuple]] = []
        status = CONTAINER_STATUS.get(env.type, "")
        if not status:  # an event that changes no status still moves the aggregate's position
            out.append((f"""UPDATE {schema}.containers SET last_seq = $3, version = version + 1
                            WHERE workspace = $1 AND container_id = $2""", (env.workspace, container_id, seq)))
            return out
        if isinstance(ev, E.ContainerRequested):
            res = ev.resources
            out.append((
                f"""INSERT INTO {schema}.containers (workspace, container_id, deployment_id, status, cpu_millicores,
                    memory_mib, gpu, gpu_count, pool, checkpoint_id, requested_at, updated_at, correlation_id, version,
                    last_seq, attempt, excluded_workers, deployment_version, note, accelerator, request)
                    VALUES ($1,$2,$3,'requested',$4,$5,$6,$7,$8,$9,$10,$10,$11,1,$12,$13,$14,$15,$16,$17,$18)
                    ON CONFLICT (workspace, container_id) DO UPDATE SET status='requested', worker_id='',
                    address='', reason='', exit_code=NULL, deployment_id=EXCLUDED.deployment_id,
                    cpu_millicores=EXCLUDED.cpu_millicores, memory_mib=EXCLUDED.memory_mib, gpu=EXCLUDED.gpu,
                    gpu_count=EXCLUDED.gpu_count, pool=EXCLUDED.pool, checkpoint_id=EXCLUDED.checkpoint_id,
                    requested_at=COALESCE({schema}.containers.requested_at, EXCLUDED.requested_at),
                    updated_at=EXCLUDED.updated_at, correlation_id=EXCLUDED.correlation_id,
                    version={schema}.containers.version + 1, ready_at=NULL, last_seq=EXCLUDED.last_seq,
                    attempt=EXCLUDED.attempt, excluded_workers=EXCLUDED.excluded_workers,
                    deployment_version=EXCLUDED.deployment_version, note=EXCLUDED.note,
                    accelerator=EXCLUDED.accelerator, restored_from='', checkpoint_to_restore='',
                    request=EXCLUDED.request""",
                (env.workspace, ev.container_id, ev.deployment_id, res.cpu_millicores, res.memory_mib, list(res.gpu),
                 res.gpu_count, ev.pool, ev.checkpoint_id, at, env.correlation_id, seq, ev.attempt,
                 list(ev.excluded_workers), ev.deployment_version, ev.note,
                 ev.checkpoint.accelerator if ev.checkpoint else "", msgspec.json.encode(ev).decode())))
            return out
        # one statement per event (the same text for every status event, so a run of them is one
        # executemany): upsert the status and whatever this event type carries
        scheduled = isinstance(ev, E.ContainerScheduled)
        out.append((
            f"""INSERT INTO {schema}.containers (workspace, container_id, status, updated_at, correlation_id, version,
                    worker_id, address, reason, exit_code, last_seq, ready_at, note, restored_from,
                    checkpoint_to_restore)
                VALUES ($1, $2, $3, $4::timestamptz, $5, 1, $6::text, $7::text, $8, $9::int, $10,
                        CASE WHEN $6::text <> '' AND $7::text <> '' THEN $4::timestamptz END, $11::text, $12::text,
                        CASE WHEN $14 THEN $13::text ELSE '' END)
                ON CONFLICT (workspace, container_id) DO UPDATE SET {_guarded(schema, {
                    "status": f"CASE WHEN $3 = 'stopping' AND {schema}.containers.status IN {ENDED} "
                              f"THEN {schema}.containers.status ELSE $3 END", "updated_at": "$4",
                    "worker_id": f"CASE WHEN $6 <> '' THEN $6 ELSE {schema}.containers.worker_id END",
                    "address": f"CASE WHEN $7 <> '' THEN $7 ELSE {schema}.containers.address END",
                    "reason": f"CASE WHEN $8 <> '' THEN $8 ELSE {schema}.containers.reason END",
                    "exit_code": f"COALESCE($9, {schema}.containers.exit_code)",
                    "ready_at": "CASE WHEN $6::text <> '' AND $7::text <> '' THEN $4::timestamptz "
                                f"ELSE {schema}.containers.ready_at END",
                    "note": f"CASE WHEN $11 <> '' THEN $11 ELSE {schema}.containers.note END",
                    "restored_from": f"CASE WHEN $12 <> '' THEN $12 ELSE {schema}.containers.restored_from END",
                    "checkpoint_to_restore": f"CASE WHEN $14 THEN $13 ELSE {schema}.containers.checkpoint_to_restore END",
                })}, version = {schema}.containers.version + 1, last_seq = $10""",
            (env.workspace, container_id, status, at, env.correlation_id, getattr(ev, "worker_id", ""),
             getattr(ev, "address", ""), getattr(ev, "reason", ""), getattr(ev, "exit_code", None), seq,
             getattr(ev, "note", ""), getattr(ev, "restored_from", ""), getattr(ev, "checkpoint_id", ""), scheduled)))
        return out


def foreign_report(placed_on: str, ev: object) -> bool:
    """A report from a worker other than the one the container is placed on (a late one from a
    worker it left, or one worker reporting on another's container): it changes nothing but the
    position. The same rule as _guarded's SQL, for state folded in memory (scheduler, gateway)."""
    reporter = getattr(ev, "worker_id", "")
    return not isinstance(ev, E.ContainerScheduled) and bool(reporter and placed_on and reporter != placed_on)


def _guarded(schema: str, updates: dict[str, str]) -> str:
    """SET clauses that leave the row as it is when the event is a report from a worker other than
    the one the container is placed on ($6 the reporting worker, $14 true for the placement itself):
    a late report from a worker the container left, or one worker reporting on another's container,
    changes nothing (its position is still recorded)."""
    foreign = (f"(NOT $14 AND $6::text <> '' AND {schema}.containers.worker_id <> '' "
               f"AND {schema}.containers.worker_id <> $6::text)")
    return ", ".join(f"{col} = CASE WHEN {foreign} THEN {schema}.containers.{col} ELSE {expr} END"
                     for col, expr in updates.items())


WORKER_STATUS = {"WorkerProvisioned": "provisioning", "WorkerRegistered": "registered", "WorkerReady": "ready",
                 "WorkerLost": "lost", "WorkerDrained": "drained"}
SLOT_EVENTS = ("WorkerSlotReserved", "WorkerSlotReleased", "WorkerCordoned", "WorkerUncordoned")


class WorkersView(BatchedProjection):
    """Workers and the slots reserved on them. One statement per event, so a batch of reservations
    (thousands a second when a backlog is placed) is one round trip per run of the same event type."""
    name = "workers"
    filter_subjects = (subjects.filter_subject(workspace=SYSTEM_WORKSPACE, aggregate="worker"),)
    tables = ("workers", "worker_slots")

    def ddl(self, schema: str) -> list[str]:
        return [f"""CREATE TABLE IF NOT EXISTS {schema}.workers (
            worker_id text PRIMARY KEY, pool text NOT NULL DEFAULT '', status text NOT NULL,
            cpu_millicores int NOT NULL DEFAULT 0, memory_mib int NOT NULL DEFAULT 0,
            gpu_type text NOT NULL DEFAULT '', gpu_count int NOT NULL DEFAULT 0,
            features text[] NOT NULL DEFAULT '{{}}', address text NOT NULL DEFAULT '',
            backend text NOT NULL DEFAULT '', updated_at timestamptz NOT NULL, version int NOT NULL DEFAULT 0,
            cordoned boolean NOT NULL DEFAULT false, draining boolean NOT NULL DEFAULT false,
            cpu_used int NOT NULL DEFAULT 0, memory_used int NOT NULL DEFAULT 0, gpu_used int NOT NULL DEFAULT 0,
            last_seq bigint NOT NULL DEFAULT 0, token_id text NOT NULL DEFAULT '')""",
                f"""CREATE TABLE IF NOT EXISTS {schema}.worker_slots (
            worker_id text NOT NULL, container_id text NOT NULL, workspace text NOT NULL, cpu_millicores int NOT NULL,
            memory_mib int NOT NULL, gpu_count int NOT NULL, reserved_seq bigint NOT NULL,
            PRIMARY KEY (worker_id, container_id))""",
                # the GPU inventory's source, cards and driver (added later: tables made before lack them)
                f"""ALTER TABLE {schema}.workers ADD COLUMN IF NOT EXISTS gpu_source text NOT NULL DEFAULT '',
            ADD COLUMN IF NOT EXISTS gpu_ids text[] NOT NULL DEFAULT '{{}}',
            ADD COLUMN IF NOT EXISTS gpu_driver text NOT NULL DEFAULT ''"""]

    def statements(self, schema: str, msg: Message, seq: int) -> list[tuple[str, tuple]]:
        ev = msg.event
        if msg.envelope.type in SLOT_EVENTS:
            return [self._slots(schema, ev, seq)]
        status = WORKER_STATUS.get(msg.envelope.type)
        if status is None:  # an event that changes nothing else still moves the worker's last sequence
            return [(f"UPDATE {schema}.workers SET last_seq = $2 WHERE worker_id = $1", (ev.aggregate_id, seq))]
        at = occurred(msg)
        upsert = f"""INSERT INTO {schema}.workers (worker_id, status, updated_at, version, last_seq{{cols}})
                     VALUES ($1, $2, $3, 1, $4{{vals}}) ON CONFLICT (worker_id) DO UPDATE SET status = $2,
                     updated_at = $3, version = {schema}.workers.version + 1, last_seq = $4{{sets}}"""
        if isinstance(ev, E.WorkerRegistered):
            sql = upsert.format(
                cols=", pool, cpu_millicores, memory_mib, gpu_type, gpu_count, features, address, token_id, gpu_source, "
                     "gpu_ids, gpu_driver",
                vals=", $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15",
                sets=f""", pool = $5, cpu_millicores = $6, memory_mib = $7, gpu_type = $8, gpu_count = $9,
                     features = $10, address = $11,
                     token_id = CASE WHEN $12 <> '' THEN $12 ELSE {schema}.workers.token_id END,
                     gpu_source = $13, gpu_ids = $14, gpu_driver = $15""")
            return [(sql, (ev.worker_id, status, at, seq, ev.pool, ev.cpu_millicores, ev.memory_mib, ev.gpu_type,
                           ev.gpu_count, list(ev.features), ev.address, ev.token_id, ev.gpu_source, list(ev.gpu_ids),
                           ev.gpu_driver))]
        if isinstance(ev, E.WorkerProvisioned):
            sql = upsert.format(cols=", pool, backend", vals=", $5, $6", sets=", pool = $5, backend = $6")
            return [(sql, (ev.worker_id, status, at, seq, ev.pool, ev.backend))]
        return [(upsert.format(cols="", vals="", sets=""), (ev.aggregate_id, status, at, seq))]

    @staticmethod
    def _slots(schema: str, ev: E.Event, seq: int) -> tuple[str, tuple]:
        """Capacity bookkeeping. A release of a slot that is not there changes nothing (idempotent);
        a reservation of a slot that is there already adds nothing."""
        if isinstance(ev, E.WorkerSlotReserved):
            return (f"""WITH taken AS (INSERT INTO {schema}.worker_slots VALUES ($1,$2,$3,$4,$5,$6,$7)
                            ON CONFLICT DO NOTHING RETURNING cpu_millicores, memory_mib, gpu_count)
                        UPDATE {schema}.workers SET last_seq = $7,
                            cpu_used = cpu_used + COALESCE((SELECT cpu_millicores FROM taken), 0),
                            memory_used = memory_used + COALESCE((SELECT memory_mib FROM taken), 0),
                            gpu_used = gpu_used + COALESCE((SELECT gpu_count FROM taken), 0)
                        WHERE worker_id = $1""",
                    (ev.worker_id, ev.container_id, ev.workspace, ev.cpu_millicores, ev.memory_mib, ev.gpu_count,
                     seq))
        if isinstance(ev, E.WorkerSlotReleased):
            # a release names the reservation it undoes: a duplicate reservation's release (a lost race)
            # must not free the slot the winner holds
            return (f"""WITH freed AS (DELETE FROM {schema}.worker_slots WHERE worker_id = $1 AND container_id = $2
                            AND ($3 = 0 OR reserved_seq = $3) RETURNING cpu_millicores, memory_mib, gpu_count)
                        UPDATE {schema}.workers SET last_seq = $4,
                            cpu_used = cpu_used - COALESCE((SELECT cpu_millicores FROM freed), 0),
                            memory_used = memory_used - COALESCE((SELECT memory_mib FROM freed), 0),
                            gpu_used = gpu_used - COALESCE((SELECT gpu_count FROM freed), 0)
                        WHERE worker_id = $1""", (ev.worker_id, ev.container_id, ev.reserved_seq, seq))
        if isinstance(ev, E.WorkerCordoned):
            return (f"UPDATE {schema}.workers SET last_seq = $3, cordoned = true, draining = $2 WHERE worker_id = $1",
                    (ev.worker_id, ev.drain, seq))
        return (f"UPDATE {schema}.workers SET last_seq = $2, cordoned = false, draining = false WHERE worker_id = $1",
                (ev.aggregate_id, seq))


class TokensView(Projection):
    """Workspace tokens by sha256 of the secret; the secret itself is never stored."""
    name = "tokens"
    filter_subjects = (subjects.filter_subject(aggregate="token"),)
    tables = ("tokens",)

    def ddl(self, schema: str) -> list[str]:
        return [f"""CREATE TABLE IF NOT EXISTS {schema}.tokens (
            token_id text PRIMARY KEY, workspace text NOT NULL, token_sha256 text NOT NULL, name text NOT NULL,
            revoked boolean NOT NULL DEFAULT false, created_at timestamptz NOT NULL,
            scope text NOT NULL DEFAULT 'workspace')""",
                f"CREATE INDEX IF NOT EXISTS tokens_sha ON {schema}.tokens (token_sha256)"]

    async def apply(self, conn: asyncpg.Connection, schema: str, msg: Message, seq: int) -> None:
        ev = msg.event
        if isinstance(ev, E.TokenCreated):
            await conn.execute(
                f"""INSERT INTO {schema}.tokens (token_id, workspace, token_sha256, name, created_at, scope)
                    VALUES ($1,$2,$3,$4,$5,$6) ON CONFLICT (token_id) DO NOTHING""",
                ev.token_id, msg.envelope.workspace, ev.token_sha256, ev.name, occurred(msg), ev.scope)
        elif isinstance(ev, E.TokenRevoked):
            await conn.execute(f"UPDATE {schema}.tokens SET revoked = true WHERE token_id = $1", ev.token_id)


class DeploymentsView(Projection):
    name = "deployments"
    filter_subjects = (subjects.filter_subject(aggregate="deployment"),)
    tables = ("deployments",)

    def ddl(self, schema: str) -> list[str]:
        return [f"""CREATE TABLE IF NOT EXISTS {schema}.deployments (
            workspace text NOT NULL, deployment_id text NOT NULL, name text NOT NULL, version int NOT NULL,
            spec jsonb NOT NULL, status text NOT NULL, created_at timestamptz NOT NULL,
            last_seq bigint NOT NULL DEFAULT 0, checkpoint_claim text NOT NULL DEFAULT '',
            claimed_at timestamptz, PRIMARY KEY (workspace, deployment_id))""",
                f"CREATE INDEX IF NOT EXISTS deployments_name ON {schema}.deployments (workspace, name, version)"]

    async def apply(self, conn: asyncpg.Connection, schema: str, msg: Message, seq: int) -> None:
        await self._apply(conn, schema, msg)
        await conn.execute(f"UPDATE {schema}.deployments SET last_seq=$3 WHERE workspace=$1 AND deployment_id=$2",
                           msg.envelope.workspace, msg.event.aggregate_id, seq)

    async def _apply(self, conn: asyncpg.Connection, schema: str, msg: Message) -> None:
        ev = msg.event
        if isinstance(ev, E.DeploymentCheckpointClaimed):
            await conn.execute(f"""UPDATE {schema}.deployments SET checkpoint_claim=$3, claimed_at=$4
                                   WHERE workspace=$1 AND deployment_id=$2""", msg.envelope.workspace,
                               ev.deployment_id, ev.checkpoint_id, occurred(msg))
        elif isinstance(ev, E.DeploymentCreated):
            await conn.execute(
                f"""INSERT INTO {schema}.deployments (workspace, deployment_id, name, version, spec, status,
                    created_at) VALUES ($1,$2,$3,$4,$5,'active',$6) ON CONFLICT DO NOTHING""",
                msg.envelope.workspace, ev.deployment_id, ev.name, ev.version, msgspec.json.encode(ev.spec).decode(),
                occurred(msg))
        elif isinstance(ev, E.DeploymentScaled):  # the spec shows the scaling in force
            changes = {k: v for k, v in msgspec.structs.asdict(ev).items() if k != "deployment_id" and v is not None}
            await conn.execute(f"""UPDATE {schema}.deployments SET spec = jsonb_set(spec, '{{scaling}}',
                                   COALESCE(spec->'scaling', '{{}}'::jsonb) || $3::jsonb)
                                   WHERE workspace=$1 AND deployment_id=$2""", msg.envelope.workspace,
                               ev.deployment_id, msgspec.json.encode(changes).decode())
        elif isinstance(ev, (E.DeploymentStopped, E.DeploymentDeleted)):
            status = "stopped" if isinstance(ev, E.DeploymentStopped) else "deleted"
            await conn.execute(f"UPDATE {schema}.deployments SET status=$3 WHERE workspace=$1 AND "
                               "deployment_id=$2", msg.envelope.workspace, ev.deployment_id, status)


class SecretsView(Projection):
    """Secrets as sealed values (levers9.runtime.sealing); only a holder of the keyring can open them."""
    name = "secrets"
    filter_subjects = (subjects.filter_subject(aggregate="secret"),)
    tables = ("secrets",)

    def ddl(self, schema: str) -> list[str]:
        return [f"""CREATE TABLE IF NOT EXISTS {schema}.secrets (
            workspace text NOT NULL, name text NOT NULL, ciphertext text NOT NULL, updated_at timestamptz NOT NULL,
            PRIMARY KEY (workspace, name))"""]

    async def apply(self, conn: asyncpg.Connection, schema: str, msg: Message, seq: int) -> None:
        ev = msg.event
        if isinstance(ev, E.SecretSet):
            await conn.execute(
                f"""INSERT INTO {schema}.secrets VALUES ($1,$2,$3,$4) ON CONFLICT (workspace, name)
                    DO UPDATE SET ciphertext=$3, updated_at=$4""", msg.envelope.workspace, ev.name, ev.ciphertext,
                occurred(msg))
        elif isinstance(ev, E.SecretDeleted):
            await conn.execute(f"DELETE FROM {schema}.secrets WHERE workspace=$1 AND name=$2",
                               msg.envelope.workspace, ev.name)


CHECKPOINT_STATUS = {"CheckpointDumped": "dumped", "CheckpointStored": "available",
                     "CheckpointFailed": "checkpoint_failed", "CheckpointDeleted": "deleted"}


class CheckpointsView(Projection):
    """Checkpoints and their status: dumped (on a node) -> available (in S3) | checkpoint_failed;
    restore_failed once a restore of it failed; deleted. Restores update last_restored_at."""
    name = "checkpoints"
    filter_subjects = (subjects.filter_subject(aggregate="checkpoint"),
                       subjects.filter_subject(aggregate="container", event_type="ContainerStarted"))
    tables = ("checkpoints",)

    def ddl(self, schema: str) -> list[str]:
        return [f"""CREATE TABLE IF NOT EXISTS {schema}.checkpoints (
            workspace text NOT NULL, checkpoint_id text NOT NULL, deployment_id text NOT NULL DEFAULT '',
            deployment_version int NOT NULL DEFAULT 0, container_id text NOT NULL DEFAULT '',
            worker_id text NOT NULL DEFAULT '', accelerator text NOT NULL DEFAULT '', runtime text NOT NULL DEFAULT '',
            status text NOT NULL, size_bytes bigint NOT NULL DEFAULT 0, sha256 text NOT NULL DEFAULT '',
            location text NOT NULL DEFAULT '', bucket text NOT NULL DEFAULT '', key text NOT NULL DEFAULT '',
            reason text NOT NULL DEFAULT '', created_at timestamptz, updated_at timestamptz NOT NULL,
            last_restored_at timestamptz, restores int NOT NULL DEFAULT 0, version int NOT NULL DEFAULT 0,
            PRIMARY KEY (workspace, checkpoint_id))""",
                f"CREATE INDEX IF NOT EXISTS checkpoints_dep ON {schema}.checkpoints (workspace, deployment_id, status)"]

    async def apply(self, conn: asyncpg.Connection, schema: str, msg: Message, seq: int) -> None:
        ev, env, at = msg.event, msg.envelope, occurred(msg)
        if isinstance(ev, E.ContainerStarted):
            if ev.restored_from:
                await conn.execute(f"""UPDATE {schema}.checkpoints SET last_restored_at=$3, restores=restores+1
                                       WHERE workspace=$1 AND checkpoint_id=$2""", env.workspace, ev.restored_from, at)
            return
        status = CHECKPOINT_STATUS.get(env.type)
        if status is None:
            return
        if isinstance(ev, E.CheckpointFailed) and ev.stage == "restore":
            status = "restore_failed"
        await conn.execute(
            f"""INSERT INTO {schema}.checkpoints (workspace, checkpoint_id, status, updated_at, created_at, version)
                VALUES ($1,$2,$3,$4,$4,1) ON CONFLICT (workspace, checkpoint_id) DO UPDATE SET status=$3,
                updated_at=$4, version={schema}.checkpoints.version + 1""", env.workspace, ev.aggregate_id, status,
            at)
        if isinstance(ev, E.CheckpointDumped):
            await conn.execute(
                f"""UPDATE {schema}.checkpoints SET deployment_id=$3, deployment_version=$4, container_id=$5,
                    worker_id=$6, accelerator=$7, runtime=$8, size_bytes=$9, sha256=$10, location=$11
                    WHERE workspace=$1 AND checkpoint_id=$2""", env.workspace, ev.checkpoint_id, ev.deployment_id,
                ev.deployment_version, ev.container_id, ev.worker_id, ev.accelerator, ev.runtime, ev.size_bytes,
                ev.sha256, ev.location)
        elif isinstance(ev, E.CheckpointStored):
            await conn.execute(f"""UPDATE {schema}.checkpoints SET bucket=$3, key=$4, size_bytes=$5, sha256=$6
                                   WHERE workspace=$1 AND checkpoint_id=$2""", env.workspace, ev.checkpoint_id,
                               ev.bucket, ev.key, ev.size_bytes, ev.sha256)
        elif isinstance(ev, E.CheckpointFailed):
            await conn.execute(f"""UPDATE {schema}.checkpoints SET reason=$3,
                                   deployment_id=CASE WHEN $4 <> '' THEN $4 ELSE deployment_id END,
                                   worker_id=CASE WHEN $5 <> '' THEN $5 ELSE worker_id END
                                   WHERE workspace=$1 AND checkpoint_id=$2""", env.workspace, ev.checkpoint_id,
                               ev.reason, ev.deployment_id, ev.worker_id)


BUILD_STATUS = {"ImageBuildRequested": "requested", "ImageBuildStarted": "building", "ImagePushed": "pushed",
                "ImageBuilt": "built", "ImageBuildFailed": "failed", "ImageDeleted": "deleted"}
LOG_TAIL_LINES = 40  # the lines a build keeps for `levers9 images logs` and a failure's message
BUILD_COLUMNS = ("status", "blueprint", "requested_by", "builder", "attempt", "steps", "cached_steps", "step_states",
                 "registry", "reference", "digest", "location", "size_bytes", "archive", "reason", "failing_step",
                 "log_tail", "requested_at", "started_at", "built_at")
BUILD_DEFAULTS = {"requested_by": "", "builder": "", "attempt": 0, "cached_steps": 0, "registry": "", "reference": "",
                  "digest": "", "location": "", "size_bytes": 0, "reason": "", "failing_step": -1}
BUILD_JSON = ("blueprint", "steps", "step_states", "archive", "log_tail")


def fold_build(row: dict, ev: E.Event, at: dt.datetime) -> dict:
    """A build's row after one more of its events (pure: the projection reads the row, folds, writes).
    A request after a failure or a deletion starts the row over; progress only adds to it."""
    row = {**row, "status": BUILD_STATUS.get(type(ev).__name__, row.get("status", "requested"))}
    if isinstance(ev, E.ImageBuildRequested):
        return {**row, "blueprint": msgspec.to_builtins(ev.blueprint), "requested_by": ev.requested_by,
                "builder": "", "attempt": 0, "steps": [], "cached_steps": 0, "step_states": {}, "reason": "",
                "failing_step": -1, "log_tail": [], "requested_at": at, "started_at": None, "built_at": None}
    if isinstance(ev, E.ImageBuildStarted):
        states = {str(s.index): {"state": "cached" if s.index < ev.cached_steps else "waiting", "seconds": 0.0}
                  for s in ev.steps}
        return {**row, "builder": ev.builder, "attempt": ev.attempt, "steps": msgspec.to_builtins(ev.steps),
                "cached_steps": ev.cached_steps, "step_states": states, "started_at": at,
                "blueprint": msgspec.to_builtins(ev.blueprint)}
    if isinstance(ev, E.ImageBuildProgress):
        row["status"] = row.get("status") or "building"
        tail = (list(row.get("log_tail") or []) + list(ev.lines))[-LOG_TAIL_LINES:]
        states = dict(row.get("step_states") or {})
        if ev.state not in ("log", "pushing"):  # pushing is the image's, not a step's
            states[str(ev.step)] = {"state": ev.state, "seconds": ev.seconds}
        return {**row, "log_tail": tail, "step_states": states}
    if isinstance(ev, E.ImagePushed):
        return {**row, "registry": ev.registry, "reference": ev.reference, "digest": ev.digest}
    if isinstance(ev, E.ImageBuilt):
        return {**row, "digest": ev.digest, "reference": ev.reference or row.get("reference", ""),
                "location": ev.location, "size_bytes": ev.size_bytes, "built_at": at, "reason": "",
                "archive": msgspec.to_builtins(ev.archive) if ev.archive else None}
    if isinstance(ev, E.ImageBuildFailed):
        states = dict(row.get("step_states") or {})
        if ev.step >= 0:
            states[str(ev.step)] = {**states.get(str(ev.step), {"seconds": 0.0}), "state": "failed"}
        return {**row, "reason": ev.reason, "failing_step": ev.step, "step_states": states,
                "log_tail": list(ev.log_tail)[-LOG_TAIL_LINES:] or row.get("log_tail") or []}
    return row


class ImageBuildsView(Projection):
    """Image builds, one row per (workspace, image id): the blueprint, its steps and each one's state,
    who builds it, where the result is (registry, S3 archive) or why it failed with the log's tail.
    `last_seq` is the image subject's last stream sequence: the expected version of the next append."""
    name = "builds"
    filter_subjects = (subjects.filter_subject(aggregate="image"),)
    tables = ("builds",)

    def ddl(self, schema: str) -> list[str]:
        return [f"""CREATE TABLE IF NOT EXISTS {schema}.builds (
            workspace text NOT NULL, image_id text NOT NULL, status text NOT NULL,
            blueprint jsonb, requested_by text NOT NULL DEFAULT '', builder text NOT NULL DEFAULT '',
            attempt int NOT NULL DEFAULT 0, steps jsonb, cached_steps int NOT NULL DEFAULT 0, step_states jsonb,
            registry text NOT NULL DEFAULT '', reference text NOT NULL DEFAULT '', digest text NOT NULL DEFAULT '',
            location text NOT NULL DEFAULT '', size_bytes bigint NOT NULL DEFAULT 0, archive jsonb,
            reason text NOT NULL DEFAULT '', failing_step int NOT NULL DEFAULT -1, log_tail jsonb,
            requested_at timestamptz, started_at timestamptz, built_at timestamptz,
            updated_at timestamptz NOT NULL, version int NOT NULL DEFAULT 0, last_seq bigint NOT NULL DEFAULT 0,
            PRIMARY KEY (workspace, image_id))""",
                f"CREATE INDEX IF NOT EXISTS builds_status ON {schema}.builds (status)"]

    async def apply(self, conn: asyncpg.Connection, schema: str, msg: Message, seq: int) -> None:
        env, ev = msg.envelope, msg.event
        found = await conn.fetchrow(f"SELECT * FROM {schema}.builds WHERE workspace=$1 AND image_id=$2",
                                    env.workspace, ev.aggregate_id)
        row = {c: found[c] for c in BUILD_COLUMNS} if found else {}
        for c in BUILD_JSON:
            if isinstance(row.get(c), str):
                row[c] = json.loads(row[c])
        row = fold_build(row, ev, occurred(msg))
        values = [json.dumps(row.get(c)) if c in BUILD_JSON else row.get(c, BUILD_DEFAULTS.get(c))
                  for c in BUILD_COLUMNS]
        await conn.execute(
            f"""INSERT INTO {schema}.builds (workspace, image_id, updated_at, version, last_seq, {', '.join(BUILD_COLUMNS)})
                VALUES ($1, $2, $3, 1, $4, {', '.join(f'${i + 5}' for i in range(len(BUILD_COLUMNS)))})
                ON CONFLICT (workspace, image_id) DO UPDATE SET updated_at=$3, last_seq=$4,
                version={schema}.builds.version + 1, {', '.join(f'{c}=EXCLUDED.{c}' for c in BUILD_COLUMNS)}""",
            env.workspace, ev.aggregate_id, occurred(msg), seq, *values)
