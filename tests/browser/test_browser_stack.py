"""The dashboard in a real browser against a real `levers9 up` (one local worker): sign in through the
link `levers9 dashboard --json` prints, deploy examples/hello.py with the CLI and watch it appear
without a reload, call it and read the container's log line and its cold-start waterfall, open the
call's correlation chain, stop the deployment from the page, and find another workspace's container
a 404 page. Saves README's screenshots (docs/screenshots/*.png, 1280x800 and one at 390x844).

The steps run in order on one signed-in tab, as a user would (each test is one step of the story).
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import tomllib
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from _browser import (
    COUNT_EVENT_SOURCES,
    DESK,
    PHONE,
    ROOT,
    chromium,
    goto,
    needs_browser,
    no_sideways_scroll,
    screenshot,
)

sys.path.insert(0, str(ROOT / "tests" / "e2e"))
from _e2e import api, bus_auth, cli, needs_runc, one_worker_stack, wait_until  # noqa: E402

needs_browser()
needs_runc()

from playwright.sync_api import expect  # noqa: E402

pytestmark = pytest.mark.slow

WAIT_MS = 120_000  # a first cold start on a loaded 2-core machine (image root, runc, on_start)
expect.set_options(timeout=WAIT_MS)
HELLO = ROOT / "examples" / "hello.py"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    with one_worker_stack(tmp_path_factory.mktemp("l9browser"), 4000, 4096) as env:
        yield env


@pytest.fixture(scope="module")
def tab(stack):
    """One tab for the whole story, counting the EventSources it makes."""
    with chromium() as browser:
        context = browser.new_context(viewport=DESK)
        context.add_init_script(COUNT_EVENT_SOURCES)
        page = context.new_page()
        page.set_default_timeout(WAIT_MS)
        yield page
        context.close()


def dashboard_url(page) -> str:
    return re.match(r"https?://[^/]+", page.url).group(0)


def test_signin_through_the_levers9_dashboard_link(stack, tab):
    link = json.loads(cli(stack, "dashboard", "--json").stdout)
    assert link["workspace"] == "default" and "/signin?ticket=" in link["url"]
    goto(tab, link["url"])
    expect(tab.get_by_test_id("workspace")).to_have_text("workspace default")
    expect(tab.get_by_test_id("live")).to_have_text("live")
    expect(tab.get_by_role("table", name="workers")).to_contain_text("ready")
    screenshot(tab, "overview")


def test_a_deploy_appears_without_a_reload(stack, tab):
    tab.get_by_role("link", name="Deployments", exact=True).click()
    expect(tab.get_by_role("heading", level=1)).to_have_text("Deployments")
    tab.evaluate("window.__sameDocument = true")  # gone if the page reloads
    cli(stack, "deploy", str(HELLO))
    expect(tab.get_by_role("link", name="hello", exact=True)).to_be_visible()
    assert tab.evaluate("window.__sameDocument") is True


def test_a_call_shows_the_containers_log_line_and_its_waterfall(stack, tab):
    tab.get_by_role("link", name="Containers", exact=True).click()
    r = api(stack, "POST", "/endpoint/hello", json={"name": "browser"})
    assert r.status_code == 200 and r.json() == {"message": "hello, browser"}, r.text
    ready = [c for c in api(stack, "GET", "/api/v1/containers").json()
             if c.get("deployment_name") == "hello" and c["status"] == "ready"]
    assert ready, "no ready container of hello after its call"
    cid = ready[0]["container_id"]
    tab.get_by_title(cid, exact=True).click()  # it came in live: the list was open before the call
    expect(tab.get_by_test_id("logs")).to_contain_text(re.compile(r"POST \S* 200"))
    waterfall = tab.get_by_test_id("waterfall")
    for phase in ("requested", "placed", "ready"):
        expect(waterfall).to_contain_text(phase)
    expect(waterfall).to_contain_text(re.compile(r"(cold|restored|shared checkpoint) start"))
    expect(tab.get_by_role("table", name="container events")).to_contain_text("ContainerReady")
    screenshot(tab, "container")


def test_the_calls_correlation_chain(stack, tab):
    tab.get_by_title(re.compile("^the chain of ")).first.click()
    chain = tab.get_by_test_id("chain")
    expect(chain).to_contain_text("ContainerRequested")
    expect(chain).to_contain_text("ContainerScheduled")
    expect(chain).to_contain_text("ContainerReady")
    assert chain.locator("li").count() >= 4
    screenshot(tab, "chain")
    tab.get_by_role("link", name="as a list").click()
    expect(tab.get_by_role("heading", level=1)).to_have_text("Event log")
    expect(tab.get_by_role("table", name="events")).to_contain_text("ContainerReady")
    screenshot(tab, "event-log")


def test_the_deployment_page_and_a_stop_from_it(stack, tab):
    tab.get_by_role("link", name="Deployments", exact=True).click()
    tab.get_by_role("link", name="hello", exact=True).click()
    expect(tab.get_by_role("figure", name="cold starts by kind")).to_contain_text("cold")
    expect(tab.get_by_role("figure", name="cold start times")).to_be_visible()
    screenshot(tab, "deployment")
    tab.once("dialog", lambda d: d.accept())
    tab.get_by_role("button", name="stop deployment").click()
    expect(tab.locator(".page-head .pill")).to_have_text("stopped")  # from the live DeploymentStopped
    assert all(d["status"] != "active" for d in api(stack, "GET", "/api/v1/deployments").json() if d["name"] == "hello")
    assert tab.evaluate("window.__eventSources") == 1, "one EventSource per tab, whatever it showed"


def test_another_workspaces_container_is_a_404_page(stack, tab):
    from levers9.cli import publish_token

    nats = next(c["url"] for c in json.loads(cli(stack, "status", "--json").stdout)["components"] if c["name"] == "nats")
    token = "l9_" + uuid.uuid4().hex
    # in a thread of its own: Playwright's sync API keeps an event loop running in this one
    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, publish_token(nats, token, "browser-other", workspace="other",
                                               auth=bus_auth(stack))).result(timeout=60)
    wait_until(lambda: api_as(stack, "GET", "/api/v1/whoami", token).status_code == 200, timeout=60)
    r = api_as(stack, "POST", "/api/v1/containers", token, json={"cpu_millicores": 100, "memory_mib": 64})
    assert r.status_code == 202, r.text
    theirs = r.json()["container_id"]
    goto(tab, f"{dashboard_url(tab)}/container/?id={theirs}")
    expect(tab.get_by_test_id("not-found")).to_contain_text(f"Container {theirs} was not found")
    api_as(stack, "POST", f"/api/v1/containers/{theirs}/stop", token)


def test_phone_width(stack, tab):
    tab.set_viewport_size(PHONE)
    goto(tab, f"{dashboard_url(tab)}/")
    expect(tab.get_by_role("table", name="workers")).to_contain_text("ready")
    no_sideways_scroll(tab)
    screenshot(tab, "overview-phone")
    tab.set_viewport_size(DESK)


def api_as(env: dict, method: str, path: str, token: str, **kw) -> httpx.Response:
    """A gateway call with another workspace's token."""
    gateway = tomllib.loads((Path(env["LEVERS9_HOME"]) / "config.toml").read_text())["gateway_url"]
    return httpx.request(method, gateway + path, headers={"Authorization": f"Bearer {token}"}, timeout=60, **kw)
