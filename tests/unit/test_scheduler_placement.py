"""Placement is a pure function: checked exhaustively with generated fleets."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from levers9.scheduler.placement import Request, WorkerState, place, reserve

GPU_TYPES = ["T4", "A10G", "A100", "H100"]


@st.composite
def workers(draw):
    n = draw(st.integers(0, 8))
    out = []
    for i in range(n):
        cpu = draw(st.sampled_from([1000, 2000, 4000, 8000]))
        mem = draw(st.sampled_from([1024, 4096, 16384]))
        gpu_type = draw(st.sampled_from(["", *GPU_TYPES]))
        gpus = draw(st.integers(1, 8)) if gpu_type else 0
        out.append(WorkerState(
            worker_id=f"w{i}", pool=draw(st.sampled_from(["default", "gpu"])),
            status=draw(st.sampled_from(["ready", "ready", "ready", "registered", "lost"])),
            cpu_millicores=cpu, memory_mib=mem, gpu_type=gpu_type, gpu_count=gpus,
            cpu_used=draw(st.integers(0, cpu)), memory_used=draw(st.integers(0, mem)),
            gpu_used=draw(st.integers(0, gpus)), features=frozenset(draw(st.sets(st.sampled_from(["runc", "criu"])))),
            cordoned=draw(st.booleans()) and draw(st.booleans())))
    return out


@st.composite
def requests(draw):
    gpu = tuple(draw(st.lists(st.sampled_from(GPU_TYPES), unique=True, max_size=3)))
    return Request(container_id="c", cpu_millicores=draw(st.sampled_from([100, 500, 1000, 3000])),
                   memory_mib=draw(st.sampled_from([128, 1024, 8192])), pool=draw(st.sampled_from(["default", "gpu"])),
                   gpu=gpu, gpu_count=draw(st.integers(1, 2)) if gpu else draw(st.sampled_from([0, 0, 1])),
                   features=frozenset(draw(st.sets(st.sampled_from(["runc", "criu"]), max_size=1))),
                   excluded=frozenset(draw(st.sets(st.sampled_from(["w0", "w1"]), max_size=1))))


def fits(req: Request, w: WorkerState) -> bool:
    count = max(1, req.gpu_count) if (req.gpu or req.gpu_count) else 0
    gpu_ok = (count == 0 or (w.gpu_free >= count and (w.gpu_type in req.gpu if req.gpu else bool(w.gpu_type))))
    return (w.status == "ready" and not w.cordoned and w.pool == req.pool and w.worker_id not in req.excluded
            and req.features <= w.features and gpu_ok and w.cpu_free >= req.cpu_millicores
            and w.memory_free >= req.memory_mib)


@settings(max_examples=600, deadline=None)
@given(req=requests(), fleet=workers())
def test_placement_is_sound_complete_and_prefers_gpu_order_then_the_fullest(req, fleet):
    decision = place(req, fleet)
    feasible = [w for w in fleet if fits(req, w)]
    if not feasible:
        assert decision.worker_id is None and decision.reason
        return
    assert decision.worker_id is not None, decision.reason
    chosen = next(w for w in fleet if w.worker_id == decision.worker_id)
    assert fits(req, chosen)
    if req.gpu:  # no feasible worker (gpu, cpu and memory) has a GPU type the caller prefers more
        best_rank = min(req.gpu.index(w.gpu_type) for w in feasible)
        assert req.gpu.index(chosen.gpu_type) == best_rank
        feasible = [w for w in feasible if w.gpu_type == chosen.gpu_type]

    def left(w):
        return ((w.cpu_free - req.cpu_millicores) / w.cpu_millicores + (w.memory_free - req.memory_mib) / w.memory_mib)

    assert all(left(chosen) <= left(w) + 1e-9 for w in feasible)


@settings(max_examples=300, deadline=None)
@given(fleet=workers(), reqs=st.lists(requests(), max_size=12))
def test_reserving_every_placement_never_overbooks(fleet, reqs):
    state = {w.worker_id: w for w in fleet}
    for i, req in enumerate(reqs):
        d = place(req, list(state.values()))
        if d.worker_id:
            state[d.worker_id] = reserve(state[d.worker_id], req, i)
    for w in state.values():
        original = next(o for o in fleet if o.worker_id == w.worker_id)
        if w != original:
            assert w.cpu_used <= w.cpu_millicores and w.memory_used <= w.memory_mib and w.gpu_used <= w.gpu_count


def test_reasons_name_what_is_missing():
    w = WorkerState("w1", "default", "ready", 1000, 1024)
    assert "no worker in pool 'gpu'" in place(Request("c", 100, 64, pool="gpu"), [w]).reason
    assert "criu" in place(Request("c", 100, 64, features=frozenset({"criu"})), [w]).reason
    assert "H100" in place(Request("c", 100, 64, gpu=("H100",), gpu_count=1), [w]).reason
    assert "cpu" in place(Request("c", 2000, 64), [w]).reason
    cordoned = WorkerState("w1", "default", "ready", 1000, 1024, cordoned=True)
    assert "uncordoned" in place(Request("c", 100, 64), [cordoned]).reason


def test_best_fit_packs_the_busier_worker_so_idle_ones_drain():
    busy = WorkerState("busy", "default", "ready", 4000, 4096, cpu_used=3000, memory_used=3000)
    idle = WorkerState("idle", "default", "ready", 4000, 4096)
    assert place(Request("c", 500, 512), [idle, busy]).worker_id == "busy"
    assert place(Request("c", 1500, 512), [idle, busy]).worker_id == "idle"
