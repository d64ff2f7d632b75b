"""A burst of first calls: one router per deployment version, never more than max_containers.

The real gateway state (`router_for`, `route_event`) and the real DeploymentRouter are driven
through hypothesis-chosen interleavings of: new calls (some with no time to wait), the projection
of the next logged event (the database row first, then the router, as the gateway does), a
container's next step (ready, failed, stopped), releases, and calls that give up. Every await of
the fakes (the database, the publish) yields a chosen number of times, so first calls overlap
while their router loads. After each step: the containers requested and not ended never exceed
max_containers, and every call shares one router. At the end every call is answered.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from dataclasses import dataclass, field
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from levers9.contracts import events as E
from levers9.contracts.spec import decode_spec
from levers9.gateway.router import DeploymentRouter, NoCapacity, Slot, StartFailed
from levers9.gateway.state import Deployment, Gateway, route_key
from levers9.runtime.config import Settings

KEY = route_key("default", "burst-v1")
ENDED = ("stopped", "failed")


def deployment(concurrency: int, max_containers: int) -> Deployment:
    spec = decode_spec(json.dumps({"name": "burst", "code": {"module": "app", "handler": "h"},
                                   "scaling": {"concurrency": concurrency, "max_containers": max_containers}}))
    return Deployment(workspace="default", deployment_id="burst-v1", name="burst", version=1, status="active",
                      spec=spec)


async def settle(n: int) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


@dataclass
class World:
    """The gateway's state with a fake database and log; `truth` is what each container really did."""
    gw: Gateway
    dep: Deployment
    draw: Any  # () -> int: how many times the next await yields
    db: dict[str, tuple[str, str]] = field(default_factory=dict)  # the projected rows: id -> (status, address)
    log: list[E.Event] = field(default_factory=list)  # appended, not yet projected
    truth: dict[str, str] = field(default_factory=dict)  # id -> requested | ready | stopped | failed
    sent: set[str] = field(default_factory=set)  # whose ContainerRequested is in the log: a worker may start them
    calls: list[asyncio.Task] = field(default_factory=list)
    held: list[tuple[DeploymentRouter, Slot]] = field(default_factory=list)
    routers: list[DeploymentRouter] = field(default_factory=list)  # the router each call got
    projecting: asyncio.Future | None = None

    async def fetch(self, query: str, *args: Any) -> list[dict]:
        await settle(self.draw())
        rows = [{"container_id": c, "status": s, "address": a} for c, (s, a) in self.db.items() if s not in ENDED]
        await settle(self.draw())
        return rows

    async def request_container(self) -> str:
        cid = f"c{len(self.truth)}"
        self.gw.container_deployment[cid] = KEY  # as routes_invoke's requester does, before it publishes
        self.truth[cid] = "requested"
        await settle(self.draw())
        self.log.append(E.ContainerRequested(container_id=cid, deployment_id="burst-v1", reason="call waiting"))
        self.sent.add(cid)
        return cid

    async def call(self, timeout: float) -> Slot:
        router = await self.gw.router_for(self.dep)
        self.routers.append(router)
        slot = await router.acquire(timeout, self.request_container)
        self.held.append((router, slot))
        return slot

    def project_next(self) -> asyncio.Future:
        """The containers projection applies the log in order: the row, then the router."""
        previous = self.projecting

        async def project() -> None:
            if previous is not None:
                await previous
            if not self.log:
                return
            ev = self.log.pop(0)
            status = {"ContainerRequested": "requested", "ContainerReady": "ready", "ContainerStopped": "stopped",
                      "ContainerFailed": "failed"}[type(ev).__name__]
            self.db[ev.container_id] = (status, getattr(ev, "address", "") or self.db.get(ev.container_id, ("", ""))[1])
            await settle(self.draw())
            await self.gw.route_event(ev, "default")
        self.projecting = asyncio.ensure_future(project())
        return self.projecting

    def advance(self, i: int, fail: bool) -> None:
        """Container i takes its next step, as its worker reports it."""
        alive = [c for c, s in self.truth.items() if s not in ENDED and c in self.sent]
        if not alive:
            return
        cid = alive[i % len(alive)]
        if self.truth[cid] == "requested" and fail:
            self.truth[cid] = "failed"
            self.log.append(E.ContainerFailed(container_id=cid, reason="app failed to start"))
        elif self.truth[cid] == "requested":
            self.truth[cid] = "ready"
            self.log.append(E.ContainerReady(container_id=cid, worker_id="w1", address=f"http://{cid}:8000"))
        else:
            self.truth[cid] = "stopped"
            self.log.append(E.ContainerStopped(container_id=cid, worker_id="w1", reason="idle"))

    async def release(self, i: int) -> None:
        if self.held:
            router, slot = self.held.pop(i % len(self.held))
            await router.release(slot)

    def leave(self, i: int) -> None:
        waiting = [t for t in self.calls if not t.done()]
        if waiting:
            waiting[i % len(waiting)].cancel()

    def check(self) -> None:
        live = [c for c, s in self.truth.items() if s not in ENDED]
        limit = self.dep.spec.scaling.max_containers
        assert len(live) <= limit, f"{len(live)} containers live (max_containers={limit}): {self.truth}"
        assert len({id(r) for r in self.routers}) <= 1, f"{len({id(r) for r in self.routers})} routers for one version"
        assert all(r is self.gw.routers[KEY] for r in self.routers), "a call holds a router the gateway forgot"


step = st.one_of(
    st.tuples(st.just("call"), st.sampled_from([1e6, 1e6, 0.0])),
    st.tuples(st.just("project"), st.integers(1, 3)),
    st.tuples(st.just("advance"), st.integers(0, 20), st.booleans()),
    st.tuples(st.just("release"), st.integers(0, 20)),
    st.tuples(st.just("leave"), st.integers(0, 20)),
    st.tuples(st.just("tick"), st.integers(1, 5)),
)


async def run(world: World, steps: list[tuple]) -> None:
    for s in steps:
        match s:
            case ("call", timeout):
                world.calls.append(asyncio.ensure_future(world.call(timeout)))
            case ("project", n):
                for _ in range(n):
                    world.project_next()
            case ("advance", i, fail):
                world.advance(i, fail)
            case ("release", i):
                await world.release(i)
            case ("leave", i):
                world.leave(i)
            case ("tick", n):
                pass
        await settle(world.draw())
        world.check()
    await drain(world)


async def drain(world: World) -> None:
    """Every container comes up, every event is projected, every held slot is released: every call that
    did not give up is answered (a slot, or why it could not have one), none is left waiting."""
    for _ in range(4 * len(world.calls) + 4):
        await settle(20)  # requests being sent reach the log
        for cid, status in list(world.truth.items()):
            if status == "requested" and cid in world.sent:
                world.truth[cid] = "ready"
                world.log.append(E.ContainerReady(container_id=cid, worker_id="w1", address=f"http://{cid}:8000"))
        while world.log:
            await world.project_next()
            world.check()
        await settle(20)
        while world.held:
            await world.release(0)
        await settle(20)
        world.check()
        if all(t.done() for t in world.calls):
            break
    stuck = [t for t in world.calls if not t.done()]
    for t in stuck:
        t.cancel()
    await asyncio.gather(*world.calls, return_exceptions=True)
    assert not stuck, f"{len(stuck)} of {len(world.calls)} calls still wait though every container is ready"
    for t in world.calls:
        assert t.cancelled() or isinstance(t.exception(), (NoCapacity, StartFailed)) or t.exception() is None


@settings(max_examples=300, deadline=None)
@given(concurrency=st.integers(1, 4), max_containers=st.integers(1, 3), steps=st.lists(step, max_size=40),
       yields=st.lists(st.integers(0, 3), min_size=1, max_size=30))
def test_concurrent_calls_share_one_router_and_never_exceed_max_containers(concurrency, max_containers, steps, yields):
    turns = itertools.cycle(yields)  # drawn up front: a draw inside a task would fail there, not here
    world = World(Gateway(Settings.load(env={"LEVERS9_SECRET_KEY": ""})), deployment(concurrency, max_containers),
                  draw=lambda: next(turns))
    world.gw.pool = world  # type: ignore[assignment]

    async def scenario() -> None:
        await run(world, [("call", 1e6), *steps])
    asyncio.run(scenario())


# ---- the same, as plain examples -------------------------------------------------------------------


def fresh(concurrency: int = 4, max_containers: int = 2, yields: int = 2) -> World:
    world = World(Gateway(Settings.load(env={"LEVERS9_SECRET_KEY": ""})), deployment(concurrency, max_containers),
                  draw=lambda: yields)
    world.gw.pool = world  # type: ignore[assignment]
    return world


async def test_twenty_concurrent_first_calls_share_one_router_and_ask_for_two_containers():
    world = fresh(concurrency=4, max_containers=2)
    world.calls = [asyncio.ensure_future(world.call(1e6)) for _ in range(20)]
    await settle(50)
    world.check()
    assert sorted(world.truth) == ["c0", "c1"] and list(world.gw.routers) == [KEY]
    await drain(world)
    assert all(t.result() for t in world.calls) and sorted(world.truth) == ["c0", "c1"]


async def test_an_event_that_arrives_while_the_router_loads_reaches_it():
    world = fresh(concurrency=1, max_containers=1, yields=5)
    world.db["c9"] = ("requested", "")
    world.truth["c9"] = "requested"
    world.gw.container_deployment["c9"] = KEY
    call = asyncio.ensure_future(world.call(1e6))
    await settle(1)  # the router is registered and reads the database
    await world.gw.route_event(E.ContainerReady(container_id="c9", worker_id="w1", address="http://c9:8000"), "default")
    await settle(50)
    assert call.done(), "the call still waits for a container the router never heard was ready"
    slot = call.result()
    assert slot.container_id == "c9" and slot.address == "http://c9:8000" and list(world.truth) == ["c9"]


async def test_a_row_read_before_a_container_ended_does_not_bring_it_back():
    world = fresh(concurrency=1, max_containers=1, yields=5)
    world.db["c9"] = ("ready", "http://c9:8000")
    world.gw.container_deployment["c9"] = KEY
    call = asyncio.ensure_future(world.call(1e6))
    await settle(1)
    world.db["c9"] = ("stopped", "http://c9:8000")  # too late for the snapshot being read
    await world.gw.route_event(E.ContainerStopped(container_id="c9", worker_id="w1"), "default")
    await settle(30)
    assert "c9" not in world.gw.routers[KEY].containers and world.truth == {"c0": "requested"}
    call.cancel()


async def test_a_failed_load_is_tried_again_by_the_next_call():
    world = fresh()
    failing = True

    async def fetch(query: str, *args: Any) -> list[dict]:
        await settle(2)
        if failing:
            raise ConnectionRefusedError("the database is down")
        return []
    world.gw.pool.fetch = fetch  # type: ignore[method-assign]
    first = [asyncio.ensure_future(world.gw.router_for(world.dep)) for _ in range(3)]
    results = await asyncio.gather(*first, return_exceptions=True)
    assert all(isinstance(r, ConnectionRefusedError) for r in results) and KEY not in world.gw.routers
    failing = False
    assert await world.gw.router_for(world.dep) is world.gw.routers[KEY]


def test_the_model_counts_what_a_router_asks_for():
    """The property's own check fails when two routers each ask for a container (the bug it guards)."""
    world = fresh(max_containers=1)
    world.truth = {"c0": "requested", "c1": "ready"}
    try:
        world.check()
    except AssertionError as exc:
        assert "2 containers live (max_containers=1)" in str(exc)
    else:
        raise AssertionError("the check let 2 live containers of max 1 pass")


async def test_a_call_that_gives_up_while_its_request_is_sent_still_counts_that_container():
    """The request goes on (it may be in the log already): the next call waits for that container
    instead of asking for one more past max_containers."""
    world = fresh(concurrency=1, max_containers=1, yields=3)
    first = asyncio.ensure_future(world.call(1e6))
    while "c0" not in world.truth:
        await asyncio.sleep(0)
    first.cancel()  # the client went away while ContainerRequested was being published
    second = asyncio.ensure_future(world.call(1e6))
    await settle(30)
    assert world.truth == {"c0": "requested"} and [type(e).__name__ for e in world.log] == ["ContainerRequested"]
    world.advance(0, fail=False)
    while world.log:
        await world.project_next()
    await settle(30)
    assert first.cancelled() and second.done() and second.result().container_id == "c0"


async def test_a_session_sandbox_seen_from_another_gateway_is_not_lent_to_its_deployment_nor_reported():
    """A session's sandbox carries its deployment's id (a deployed function's): a gateway that does
    not hold the session maps it to no router, so it never serves the deployment's calls, and the
    load sample reports the deployment's router (what the autoscaler scales on), never a session's."""
    from levers9.gateway import load_report

    world = fresh(concurrency=1, max_containers=2)
    router = await world.gw.router_for(world.dep)
    for ev in (E.ContainerRequested(container_id="s1", deployment_id="burst-v1", session_id="abc"),
               E.ContainerReady(container_id="s1", worker_id="w1", address="http://s1:8000"),
               E.ContainerRequested(container_id="c9", deployment_id="burst-v1", reason="autoscaler: min"),
               E.ContainerReady(container_id="c9", worker_id="w1", address="http://c9:8000")):
        await world.gw.route_event(ev, "default")
    assert list(router.containers) == ["c9"]
    world.gw.routers["session:abc"] = DeploymentRouter("session:abc", 1, max_containers=1)
    slot = await router.acquire(1e6, world.request_container)
    sample = load_report.sample("g1", world.gw.routers)
    assert list(sample["deployments"]) == [KEY]
    assert sample["deployments"][KEY]["containers"] == {"c9": [1, 0.0]} and slot.container_id == "c9"
