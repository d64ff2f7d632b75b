"""What the scheduler's unit tests share: messages built like the log's, and generated logs."""

from __future__ import annotations

from hypothesis import strategies as st

from levers9.contracts import Message, envelope
from levers9.contracts import events as E
from levers9.contracts.envelope import subject_of
from levers9.contracts.spec import CheckpointRef, Resources

WS = "default"


def msg(event: E.Event, workspace: str = WS, correlation_id: str | None = None) -> Message:
    env = envelope(event, workspace=workspace, correlation_id=correlation_id)
    return Message(env, event, subject_of(env, event))


def requested(cid: str, cpu: int = 500, mem: int = 256, pool: str = "default", gpu: list[str] | None = None,
              gpu_count: int = 0, checkpoint: CheckpointRef | None = None, excluded: list[str] | None = None,
              attempt: int = 1, note: str = "") -> E.ContainerRequested:
    return E.ContainerRequested(container_id=cid, deployment_id="d1", deployment_version=3,
                                resources=Resources(cpu_millicores=cpu, memory_mib=mem, gpu=gpu or [],
                                                    gpu_count=gpu_count),
                                pool=pool, checkpoint=checkpoint, excluded_workers=excluded or [], attempt=attempt,
                                note=note)


def registered(wid: str, cpu: int = 2000, mem: int = 2048, pool: str = "default", gpu_type: str = "",
               gpu_count: int = 0, features: tuple[str, ...] = ("runc",)) -> E.WorkerRegistered:
    return E.WorkerRegistered(worker_id=wid, pool=pool, cpu_millicores=cpu, memory_mib=mem, gpu_type=gpu_type,
                              gpu_count=gpu_count, features=list(features))


WORKERS = ["w0", "w1"]
CONTAINERS = ["c0", "c1", "c2", "c3"]


@st.composite
def worker_events(draw: st.DrawFn, wid: str) -> list[E.Event]:
    """One worker's events in log order: registered, ready, then slots taken and given back, cordons."""
    out: list[E.Event] = [registered(wid, cpu=draw(st.sampled_from([1000, 2000, 4000])),
                                     mem=draw(st.sampled_from([1024, 4096])))]
    if draw(st.booleans()):
        out.append(E.WorkerReady(worker_id=wid))
    for _ in range(draw(st.integers(0, 12))):
        cid = draw(st.sampled_from(CONTAINERS))
        kind = draw(st.sampled_from(["reserve", "reserve", "release", "release_any", "cordon", "uncordon", "lost"]))
        if kind == "reserve":
            out.append(E.WorkerSlotReserved(worker_id=wid, container_id=cid, workspace=WS,
                                            cpu_millicores=draw(st.sampled_from([100, 500, 1500])),
                                            memory_mib=draw(st.sampled_from([64, 512])),
                                            gpu_count=draw(st.sampled_from([0, 0, 1]))))
        elif kind in ("release", "release_any"):
            # a release names a reservation by its sequence: any number here, the right one or not
            seq = 0 if kind == "release_any" else draw(st.integers(1, 40))
            out.append(E.WorkerSlotReleased(worker_id=wid, container_id=cid, reserved_seq=seq))
        elif kind == "cordon":
            out.append(E.WorkerCordoned(worker_id=wid))
        elif kind == "uncordon":
            out.append(E.WorkerUncordoned(worker_id=wid))
        else:
            out.append(E.WorkerLost(worker_id=wid))
    return out


@st.composite
def container_events(draw: st.DrawFn, cid: str) -> list[E.Event]:
    out: list[E.Event] = []
    for _ in range(draw(st.integers(0, 6))):
        kind = draw(st.sampled_from(["requested", "scheduled", "deferred", "started", "ready", "stopped", "failed",
                                     "checkpoint"]))
        wid = draw(st.sampled_from(WORKERS))
        out.append({
            "requested": lambda: requested(cid, attempt=draw(st.integers(1, 3))),
            "scheduled": lambda: E.ContainerScheduled(container_id=cid, worker_id=wid),
            "deferred": lambda: E.PlacementDeferred(container_id=cid, reason=draw(st.sampled_from(["full", "none"]))),
            "started": lambda: E.ContainerStarted(container_id=cid, worker_id=wid),
            "ready": lambda: E.ContainerReady(container_id=cid, worker_id=wid, address="10.0.0.2:8000"),
            "stopped": lambda: E.ContainerStopped(container_id=cid, worker_id=wid),
            "failed": lambda: E.ContainerFailed(container_id=cid, reason="oom"),
            "checkpoint": lambda: E.ContainerCheckpointRequested(container_id=cid),
        }[kind]())
    return out


@st.composite
def interleavings(draw: st.DrawFn, streams: list[list[E.Event]]) -> list[E.Event]:
    """One log from several aggregates' streams: each stream's order kept, the merge drawn."""
    cursors = [0] * len(streams)
    out = []
    while any(c < len(s) for c, s in zip(cursors, streams, strict=True)):
        i = draw(st.sampled_from([i for i, s in enumerate(streams) if cursors[i] < len(s)]))
        out.append(streams[i][cursors[i]])
        cursors[i] += 1
    return out


@st.composite
def logs(draw: st.DrawFn) -> list[tuple[Message, int]]:
    """A log of worker and container events with their stream sequences (1, 2, ...)."""
    streams = [draw(worker_events(w)) for w in WORKERS] + [draw(container_events(c)) for c in CONTAINERS]
    events = draw(interleavings(streams))
    return [(msg(e), seq) for seq, e in enumerate(events, start=1)]
