"""Headless Chromium (Debian's, at /usr/bin/chromium) driven by Playwright against a real server.

Registered once for the whole suite (tests/conftest.py `pytest_plugins`): one Playwright session, so
a module outside tests/ui that drives pages shares the browser instead of starting a second one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.utils.servers import OUTPUT
from tests.utils.wait import DEADLINE

CHROMIUM = Path(os.environ.get("TUNEDECK_CHROMIUM", "/usr/bin/chromium"))
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SHOTS = OUTPUT / "ui"


class Browser:
    """Playwright's browser, whose every context waits up to DEADLINE for what a page should show
    (Playwright's own default, 30 s, is short for a loaded machine where a fine-tune runs beside the
    page). A deadline only bounds a hang: a page that is ready goes on at once."""

    def __init__(self, browser):
        self._browser = browser

    def new_context(self, **options):
        context = self._browser.new_context(**options)
        context.set_default_timeout(DEADLINE * 1000)
        return context

    def __getattr__(self, name: str):
        return getattr(self._browser, name)


@pytest.fixture(scope="session")
def browser():
    if not CHROMIUM.exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (scripts/setup.sh dev installs Debian's chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is in the dev extra")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        yield Browser(b)
        b.close()


def _page(browser, *, bypass_csp: bool):
    context = browser.new_context(
        viewport={"width": 1400, "height": 1000}, accept_downloads=True, bypass_csp=bypass_csp
    )
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.errors = errors
    csp: list[str] = []
    pg.on("console", lambda m: csp.append(m.text) if "Content Security Policy" in m.text else None)
    pg.csp_violations = csp
    return context, pg


@pytest.fixture
def page(browser):
    # Playwright's wait_for_function evaluates strings, which the pages' policy (no eval) forbids.
    context, pg = _page(browser, bypass_csp=True)
    yield pg
    context.close()


@pytest.fixture
def strict_page(browser):
    """A page under the server's Content-Security-Policy: wait with locators, not wait_for_function."""
    context, pg = _page(browser, bypass_csp=False)
    yield pg
    context.close()


def shot(page, name: str) -> Path:
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
