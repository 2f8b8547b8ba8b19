"""Open a local HTML page in a real headless Chromium and report what a reader would see.

Uses Playwright's Python package driving Debian's ``chromium`` (no browser
download): ``executable_path`` points at the system binary. Tests skip when
either is missing, except on CI (``CI=true``), where ``.ci/run`` installs both and
a missing piece fails the test.
"""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from conftest import skip_or_fail

INSTALL_HINT = "apt-get install chromium, and pip install -e '.[dev]' for playwright; .ci/run does both"

# Every <img>: decoded (img.decode() resolves) with its natural size; a broken one is reported, not thrown.
IMAGES_JS = """
async () => Promise.all(Array.from(document.images, async (img) => {
  let decoded = true;
  try { await img.decode(); } catch (e) { decoded = false; }
  return {alt: img.alt, decoded, width: img.naturalWidth, height: img.naturalHeight};
}))
"""
# Every table[data-table]: its header's data-column names, and per body cell the data-value and the shown text.
TABLES_JS = """
() => Object.fromEntries(Array.from(document.querySelectorAll("table[data-table]"), (table) => [
  table.dataset.table,
  {
    columns: Array.from(table.querySelectorAll("thead th"), (th) => th.dataset.column),
    headers: Array.from(table.querySelectorAll("thead th"), (th) => th.textContent),
    rows: Array.from(table.querySelectorAll("tbody tr"), (tr) =>
      Array.from(tr.cells, (td) => ({value: td.dataset.value, text: td.textContent}))),
  },
]))
"""


@dataclass
class PageReport:
    """What the browser saw: errors, requests beyond the page itself, images and tables."""

    console_errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    images: list[dict] = field(default_factory=list)
    tables: dict[str, dict] = field(default_factory=dict)
    empty_tables: list[str] = field(default_factory=list)
    title: str = ""

    @property
    def broken_images(self) -> list[str]:
        return [img["alt"] for img in self.images if not img["decoded"] or img["width"] == 0 or img["height"] == 0]


def chromium() -> str:
    """The system Chromium's path; skips the test (fails it on CI) when it or Playwright is missing."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    missing = []
    if path is None:
        missing.append("Debian's chromium is not installed")
    if importlib.util.find_spec("playwright") is None:
        missing.append("the playwright package is not installed")
    if missing:
        skip_or_fail("browser test", "; ".join(missing), INSTALL_HINT)
    return path


def inspect_page(page_path: Path, executable: str) -> PageReport:
    """Load ``page_path`` (file://) in headless Chromium and collect a :class:`PageReport`."""
    from playwright.sync_api import sync_playwright

    report = PageReport()
    url = Path(page_path).resolve().as_uri()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, headless=True)
        try:
            page = browser.new_page()
            page.on("console", lambda message: report.console_errors.append(message.text) if message.type == "error" else None)
            page.on("pageerror", lambda error: report.console_errors.append(f"uncaught: {error}"))
            page.on("request", lambda request: report.requests.append(request.url) if request.url != url else None)
            page.goto(url, wait_until="load")
            report.title = page.title()
            report.images = page.evaluate(IMAGES_JS)
            report.tables = page.evaluate(TABLES_JS)
            report.empty_tables = page.evaluate('() => Array.from(document.querySelectorAll("p.empty[data-table]"), (p) => p.dataset.table)')
        finally:
            browser.close()
    # data: URIs are part of the page, not requests to anywhere
    report.requests = [r for r in report.requests if not r.startswith("data:")]
    return report


@contextmanager
def opened(page_path: Path, executable: str, viewport: tuple[int, int] = (1366, 768)) -> Iterator[tuple[object, list[str]]]:
    """``(page, console_errors)``: ``page_path`` loaded in headless Chromium with a window of
    ``viewport`` (a laptop's screen), for a test to look at and click through (Playwright's Page)."""
    from playwright.sync_api import sync_playwright

    errors: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, headless=True)
        try:
            page = browser.new_page(viewport={"width": viewport[0], "height": viewport[1]})
            page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
            page.on("pageerror", lambda error: errors.append(f"uncaught: {error}"))
            page.goto(Path(page_path).resolve().as_uri(), wait_until="load")
            yield page, errors
        finally:
            browser.close()
