"""The overview's and the chain's pure functions (levers9.dashboard.views)."""

from __future__ import annotations

import sys

from hypothesis import given
from hypothesis import strategies as st

from levers9.dashboard import views


def test_deployments_grouped_with_their_versions():
    out = views.deployments_view([{"name": "a", "version": 1, "status": "stopped"},
                                  {"name": "a", "version": 2, "status": "active"}, {"name": "b", "version": 1}])
    assert [(d["name"], d["version"], d["status"]) for d in out] == [("a", 2, "active"), ("b", 1, None)]
    assert [v["version"] for v in out[0]["versions"]] == [2, 1]


def test_containers_counted_by_state_and_ended_from_the_total():
    live = [{"status": "ready"}] * 3 + [{"status": "requested"}]
    assert views.containers_view(live, 10) == {"by_state": {"ready": 3, "requested": 1}, "live": 4, "total": 10,
                                               "ended": 6}


def test_pools_sum_the_free_capacity_of_workers_that_take_work():
    rows = [{"worker_id": "w1", "pool": "gpu", "status": "ready", "cpu_millicores": 4000, "cpu_used": 1000,
             "memory_mib": 8000, "memory_used": 0, "gpu_type": "H100", "gpu_count": 2, "gpu_used": 1},
            {"worker_id": "w2", "pool": "gpu", "status": "ready", "cordoned": True, "cpu_millicores": 4000,
             "gpu_type": "A100", "gpu_count": 1},
            {"worker_id": "w3", "pool": "default", "status": "lost", "cpu_millicores": 2000}]
    out = views.workers_view(rows)
    gpu = next(p for p in out["pools"] if p["pool"] == "gpu")
    assert gpu == {"pool": "gpu", "workers": 2, "ready": 1, "free": {"cpu_millicores": 3000, "memory_mib": 8000, "gpus": 1},
                   "gpu_types": ["H100", "A100"]}
    assert out["workers"][0]["free"]["gpus"] == 1


def test_failures_keep_their_reasons():
    out = views.failures_view([{"seq": 3, "type": "ContainerFailed", "data": {"reason": "OOM"}},
                               {"seq": 2, "type": "ImageBuildFailed", "data": {"error": "apt failed"}}])
    assert [f["reason"] for f in out] == ["OOM", "apt failed"]


def node_ids(nodes):
    for n in nodes:
        yield n["event"]["id"]
        yield from node_ids(n["children"])


@given(st.lists(st.tuples(st.integers(0, 30), st.integers(-1, 30)), max_size=60))
def test_the_chain_holds_every_event_once_under_its_cause(pairs):
    """Any causation graph (loops and missing causes included): every event appears exactly once,
    a child under the event that caused it, children in log order."""
    events = [{"seq": i + 1, "id": f"e{a}", "causation_id": f"e{b}" if b >= 0 else ""}
              for i, (a, b) in enumerate(pairs)]
    tree = views.chain("c", events)
    ids = list(node_ids(tree["roots"]))
    assert sorted(ids) == sorted({e["id"] for e in events})

    def check(node):
        seqs = [c["event"]["seq"] for c in node["children"]]
        assert seqs == sorted(seqs)
        for child in node["children"]:
            assert child["event"]["causation_id"] == node["event"]["id"]
            check(child)

    for root in tree["roots"]:
        check(root)


def test_a_very_deep_chain_is_cut_not_lost():
    events = [{"seq": i + 1, "id": f"e{i}", "causation_id": f"e{i - 1}" if i else ""} for i in range(1000)]
    tree = views.chain("c", events)
    assert len(list(node_ids(tree["roots"]))) == 1000
    assert len(tree["roots"]) == 10  # one root per MAX_DEPTH (100) of depth
    import json
    limit = sys.getrecursionlimit()
    json.dumps(tree)  # serialisable within the interpreter's recursion limit
    assert sys.getrecursionlimit() == limit
