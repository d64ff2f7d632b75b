"""The web app in a real browser (Debian's chromium, Playwright) against the real dashboard backend
(levers9.dashboard) and the FAKE gateway of tests/fakes: fast, no stack. Sign-in by ticket and by a
pasted token, a container appearing live without a reload, one EventSource per tab across pages,
a container's waterfall, log and events, its correlation chain, a stop sent with the CSRF header,
another workspace's container and an unknown page as 404 pages, and the phone width.
(tests/browser/test_browser_stack.py does the same against a real `levers9 up`.)
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
from pathlib import Path
from typing import Any, Iterator

import pytest
from _browser import COUNT_EVENT_SOURCES, DESK, PHONE, WEB_OUT, chromium, goto, needs_browser, no_sideways_scroll

needs_browser()

from fakes.dashboard_harness import Harness, dashboard  # noqa: E402
from fakes.fake_gateway import FakeGateway, now_iso  # noqa: E402
from playwright.sync_api import expect  # noqa: E402

WAIT_MS = 15000
expect.set_options(timeout=WAIT_MS)


class Served:
    """The dashboard and its fake gateway, served from an event loop in a thread of their own, so
    the tests drive the browser with Playwright's sync API and append events from here."""

    def __init__(self, harness: Harness, loop: asyncio.AbstractEventLoop) -> None:
        self.h, self.loop = harness, loop

    @property
    def url(self) -> str:
        return self.h.url

    @property
    def gw(self) -> FakeGateway:
        return self.h.gw

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=30)

    def ticket(self, token: str = "tok-a") -> str:
        return self.run(self.h.ticket(token))

    def append(self, ws: str, type_: str, aggregate: str, aggregate_id: str, data: dict | None = None, **kw: Any) -> dict:
        return self.run(self.gw.append(ws, type_, aggregate, aggregate_id, data, **kw))


@contextlib.contextmanager
def served(home: Path, gw: FakeGateway) -> Iterator[Served]:
    loop = asyncio.new_event_loop()
    ready: dict[str, Any] = {}
    started = threading.Event()

    async def main() -> None:
        ready["stop"] = asyncio.Event()
        try:
            async with dashboard(home, gw, web_out=WEB_OUT) as h:
                ready["h"] = h
                started.set()
                await ready["stop"].wait()
        finally:
            started.set()

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), name="dashboard", daemon=True)
    thread.start()
    assert started.wait(30) and "h" in ready, "the dashboard did not start"
    try:
        yield Served(ready["h"], loop)
    finally:
        loop.call_soon_threadsafe(ready["stop"].set)
        thread.join(30)
        loop.close()


def container_row(ws: str, cid: str, **kw: Any) -> dict:
    return {"workspace": ws, "container_id": cid, "status": "ready", "deployment_id": "d-hello-1",
            "deployment_name": "hello", "worker_id": "local-1", "cpu_millicores": 500, "memory_mib": 256,
            "pool": "default", "updated_at": now_iso(), "requested_at": now_iso(), "ready_at": now_iso(900),
            "correlation_id": f"corr-{cid}", "restored_from": "", **kw}


def seeded() -> FakeGateway:
    gw = FakeGateway()
    gw.deployments.append({"workspace": "ws-a", "name": "hello", "version": 1, "status": "active",
                           "deployment_id": "d-hello-1", "created_at": now_iso()})
    gw.deployments.append({"workspace": "ws-b", "name": "theirs", "version": 1, "status": "active",
                           "deployment_id": "d-theirs-1", "created_at": now_iso()})
    gw.workers.append({"worker_id": "local-1", "pool": "default", "status": "ready", "cpu_millicores": 4000,
                       "memory_mib": 4096, "cpu_used": 500, "memory_used": 256, "gpu_type": "", "gpu_count": 0,
                       "gpu_used": 0, "features": ["runc", "criu"], "cordoned": False, "draining": False,
                       "updated_at": now_iso(), "backend": "local"})
    gw.containers["c-a1"] = container_row("ws-a", "c-a1")
    gw.containers["c-b1"] = container_row("ws-b", "c-b1", deployment_id="d-theirs-1", deployment_name="theirs")
    gw.logs["c-a1"] = "levers9 runner listening on 0.0.0.0:8000\nPOST / 200 3.1ms\n"
    return gw


async def cold_start(gw: FakeGateway, ws: str, cid: str) -> None:
    """A container's path from request to ready, each event caused by the one before."""
    cause = ""
    for offset, type_ in ((0, "ContainerRequested"), (40, "ContainerScheduled"), (700, "ContainerStarted"),
                          (900, "ContainerReady")):
        ev = await gw.append(ws, type_, "container", cid, {"container_id": cid, "worker_id": "local-1"},
                             correlation_id=f"corr-{cid}", causation_id=cause, occurred_at=now_iso(offset))
        cause = ev["id"]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Iterator[Served]:
    gw = seeded()
    with served(tmp_path_factory.mktemp("dash"), gw) as s:
        s.run(cold_start(gw, "ws-a", "c-a1"))
        s.run(cold_start(gw, "ws-b", "c-b1"))
        yield s


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


@pytest.fixture
def page(browser, site):
    """A tab signed in to ws-a through a one-time ticket, on the overview."""
    context = browser.new_context(viewport=DESK)
    context.add_init_script(COUNT_EVENT_SOURCES)
    tab = context.new_page()
    tab.set_default_timeout(WAIT_MS)
    goto(tab, site.ticket("tok-a"))
    expect(tab.get_by_test_id("workspace")).to_have_text("workspace ws-a")
    yield tab
    context.close()


def test_signin_by_ticket_shows_the_overview_live(page):
    expect(page).to_have_url(re.compile(r"/$"))
    expect(page.get_by_role("link", name="hello")).to_be_visible()
    expect(page.get_by_test_id("live")).to_have_text("live")
    expect(page.get_by_test_id("container-counts")).to_contain_text("ready")


def test_unauthenticated_page_goes_to_signin_and_a_pasted_token_signs_in(browser, site):
    context = browser.new_context(viewport=DESK)
    tab = context.new_page()
    tab.set_default_timeout(WAIT_MS)
    goto(tab, site.url + "/containers/")
    expect(tab).to_have_url(re.compile(r"/signin/\?next=%2Fcontainers%2F$"))
    tab.get_by_label("token").fill("tok-b")
    tab.get_by_role("button", name="sign in").click()
    expect(tab.get_by_test_id("workspace")).to_have_text("workspace ws-b")
    expect(tab).to_have_url(re.compile(r"/containers/$"))  # back where the link pointed
    goto(tab, site.url + "/signin/")
    tab.get_by_label("token").fill("not-a-token")
    tab.get_by_role("button", name="sign in").click()
    expect(tab.get_by_text("does not accept this token")).to_be_visible()
    context.close()


def test_a_new_container_appears_without_a_reload(page, site):
    page.get_by_role("link", name="Containers", exact=True).click()
    expect(page.get_by_title("c-a1", exact=True)).to_be_visible()
    page.evaluate("window.__sameDocument = true")  # gone if the page reloads
    site.gw.containers["c-a2"] = container_row("ws-a", "c-a2", status="requested", worker_id="")
    site.append("ws-a", "ContainerRequested", "container", "c-a2", {"container_id": "c-a2"})
    expect(page.get_by_title("c-a2", exact=True)).to_be_visible()
    assert page.evaluate("window.__sameDocument") is True
    del site.gw.containers["c-a2"]


def test_one_event_source_per_tab_across_pages(page):
    for name in ("Deployments", "Containers", "Workers", "Event log", "Overview"):
        page.get_by_role("link", name=name, exact=True).click()
        expect(page.get_by_role("heading", level=1)).to_have_text(name)
    assert page.evaluate("window.__eventSources") == 1


def test_every_page_renders_without_a_script_error(page, site):
    errors: list[str] = []
    page.on("pageerror", lambda err: errors.append(str(err)))
    pages = {"Overview": "Overview", "Deployments": "Deployments", "Containers": "Containers",
             "Function calls": "Function calls", "Tasks": "Tasks", "Images": "Images", "Checkpoints": "Checkpoints",
             "Workers": "Workers", "Event log": "Event log", "Volumes": "Volumes", "Secrets": "Secrets",
             "Tokens": "Tokens"}
    for link, heading in pages.items():
        page.get_by_role("link", name=link, exact=True).click()
        expect(page.get_by_role("heading", level=1)).to_have_text(heading)
    for path in ("/deployment/?name=hello", "/call/?id=nope", "/image/?id=nope", "/chain/?id=corr-c-a1"):
        goto(page, site.url + path)
        expect(page.locator("h1").first).to_be_visible()
    assert errors == []


def test_container_page_waterfall_log_events_and_chain(page, site):
    goto(page, site.url + "/container/?id=c-a1")
    waterfall = page.get_by_test_id("waterfall")
    for phase in ("requested", "placed", "started", "ready"):
        expect(waterfall).to_contain_text(phase)
    expect(waterfall).to_contain_text("+660 ms")
    expect(page.get_by_test_id("logs")).to_contain_text("POST / 200")
    expect(page.get_by_role("table", name="container events")).to_contain_text("ContainerReady")
    page.get_by_title("the chain of corr-c-a1").first.click()
    chain = page.get_by_test_id("chain")
    expect(chain.locator("li")).to_have_count(4)
    expect(chain.locator("li").nth(3)).to_contain_text("ContainerReady")
    expect(chain.locator("li").nth(3)).to_contain_text("+900 ms")


def test_an_image_builds_log_streams_line_by_line_from_its_events(page, site):
    site.gw.images["img-1"] = {"workspace": "ws-a", "image_id": "img-1", "status": "building", "reference": "",
                               "steps": [{"index": 0, "text": "RUN make", "state": "running"}], "failing_step": -1,
                               "log_tail": ["tail only"], "size_bytes": 0}
    site.append("ws-a", "ImageBuildProgress", "image", "img-1", {"step": 0, "total": 1, "state": "log",
                                                               "lines": ["compiling a.c", "compiling b.c"]})
    goto(page, site.url + "/image/?id=img-1")
    log = page.get_by_test_id("build-log")
    expect(log).to_contain_text("compiling b.c")  # the history, read from the event log
    site.append("ws-a", "ImageBuildProgress", "image", "img-1", {"step": 0, "total": 1, "state": "log",
                                                               "lines": ["linking levers9"]})
    expect(log).to_contain_text("linking levers9")  # live, without a reload
    assert log.inner_text().count("compiling a.c") == 1 and "tail only" not in log.inner_text()


def test_tasks_appear_live_and_one_is_cancelled_and_schedules_show_their_next_runs(page, site):
    row = {"workspace": "ws-a", "task_id": "t-1", "deployment_id": "tq-v1", "queue": "square", "function": "a.square",
           "status": "running", "attempt": 1, "reason": "", "enqueued_at": now_iso(), "updated_at": now_iso()}
    site.gw.tasks["t-b"] = {**row, "workspace": "ws-b", "task_id": "t-b", "queue": "theirs"}
    site.gw.schedules.append({"workspace": "ws-a", "name": "minutely", "deployment_id": "m-v1", "cron": "* * * * *",
                              "timezone": "Europe/Berlin", "catch_up": True, "next_runs": ["2026-12-06T08:00:00+01:00"],
                              "last_tick": "", "last_task_id": ""})
    goto(page, site.url + "/tasks/")
    expect(page.get_by_role("table", name="schedules")).to_contain_text("Europe/Berlin")
    expect(page.get_by_role("table", name="tasks")).to_contain_text("no tasks")  # another workspace's: not listed
    site.gw.tasks["t-1"] = row
    site.append("ws-a", "TaskStarted", "task", "t-1", {"task_id": "t-1"})
    tasks = page.get_by_role("table", name="tasks")
    expect(tasks).to_contain_text("square")  # live, without a reload
    page.once("dialog", lambda d: d.accept())
    tasks.get_by_role("button", name="cancel").click()
    expect(page.get_by_role("status").filter(has_text="asked")).to_be_visible()
    assert ("ws-a", "/api/v1/tasks/t-1/cancel") in site.gw.posts
    goto(page, site.url + "/task/?id=t-b")
    expect(page.get_by_test_id("not-found")).to_contain_text("Task t-b was not found")


def test_stop_from_the_page_sends_the_csrf_header(page, site):
    goto(page, site.url + "/deployment/?name=hello")
    expect(page.get_by_text("queue depth (most calls waiting at once)")).to_be_visible()
    page.once("dialog", lambda d: d.accept())
    page.get_by_role("button", name="stop deployment").click()
    expect(page.get_by_role("status").filter(has_text="asked")).to_be_visible()
    assert ("ws-a", "/api/v1/deployments/hello/stop") in site.gw.posts


def test_another_workspaces_container_and_an_unknown_page_are_404(page, site):
    goto(page, site.url + "/container/?id=c-b1")
    expect(page.get_by_test_id("not-found")).to_contain_text("Container c-b1 was not found")
    expect(page.get_by_text("theirs")).to_have_count(0)
    response = goto(page, site.url + "/no-such-page/")
    assert response is not None and response.status == 404
    expect(page.get_by_test_id("not-found")).to_be_visible()


def test_phone_width(page, site):
    page.set_viewport_size(PHONE)
    for path in ("/", "/containers/", "/container/?id=c-a1", "/chain/?id=corr-c-a1", "/log/"):
        goto(page, site.url + path)
        expect(page.get_by_role("heading", level=1)).to_be_visible()
        no_sideways_scroll(page)
