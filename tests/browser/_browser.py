"""Helpers of the browser tests: Playwright (from PyPI) driving Debian's chromium, never a browser of
its own (a download cannot work here), against the built web app (services/dashboard/web/out/,
made by scripts/setup.sh), and small PNG screenshots for README.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator

import pytest

ROOT = Path(__file__).resolve().parents[2]
WEB_OUT = ROOT / "services" / "dashboard" / "web" / "out"
SCREENSHOTS = ROOT / "docs" / "screenshots"
CHROMIUM = os.environ.get("LEVERS9_CHROMIUM", "/usr/bin/chromium")
DESK = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}
MAX_PNG = 150 * 1024


def needs_browser() -> None:
    """Skip the module unless Playwright, chromium and the built web app are here."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.skip("playwright is not installed (scripts/setup.sh --test)", allow_module_level=True)
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no chromium at {CHROMIUM} (scripts/setup.sh --test installs Debian's)", allow_module_level=True)
    if not (WEB_OUT / "index.html").is_file():
        pytest.skip("the web app is not built (scripts/setup.sh builds services/dashboard/web/out/)",
                    allow_module_level=True)


@contextlib.contextmanager
def chromium() -> Iterator[object]:
    """A headless Debian chromium (playwright.sync_api.Browser), closed after."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            yield browser
        finally:
            browser.close()


# Counts the EventSource objects a tab makes: the app must open exactly one, whatever it shows.
COUNT_EVENT_SOURCES = """
(() => {
  const Real = window.EventSource;
  window.__eventSources = 0;
  window.EventSource = function (...args) { window.__eventSources += 1; return new Real(...args); };
  window.EventSource.prototype = Real.prototype;
  Object.assign(window.EventSource, { CONNECTING: 0, OPEN: 1, CLOSED: 2 });
})();
"""


def screenshot(page, name: str) -> Path:
    """The viewport as docs/screenshots/NAME.png (chromium's PNG of a flat page is 40-100 KB; the
    assertion keeps README's images small)."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    path.write_bytes(page.screenshot(type="png", animations="disabled", caret="hide"))
    assert path.stat().st_size < MAX_PNG, f"{path} is {path.stat().st_size} bytes: keep README's screenshots small"
    return path


def no_sideways_scroll(page) -> None:
    """The document is no wider than the viewport (wide tables scroll inside their own box)."""
    width = page.evaluate("document.scrollingElement.scrollWidth")
    assert width <= page.viewport_size["width"] + 1, f"the page is {width}px wide at {page.viewport_size['width']}px"


def goto(page, url: str, attempts: int = 5):
    """page.goto, again when Chromium aborts it with ERR_NETWORK_CHANGED: it drops navigations in
    flight whenever the host's interfaces change, and on a machine running containers (another lane's
    veths) they do at any moment. Any other failure is the test's."""
    for attempt in range(attempts):
        try:
            return page.goto(url)
        except Exception as exc:  # playwright's Error: only this one cause is tried again
            if "ERR_NETWORK_CHANGED" not in str(exc) or attempt == attempts - 1:
                raise
