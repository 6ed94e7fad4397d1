"""Playwright driving Debian's chromium (headless) against pytest-django's live server.

The worker runs in-process: the `task_queue` fixture collects what the outbox sends and
the test calls `drain()` between browser steps, as a Celery worker would. Every journey
saves screenshots under test-artifacts/<journey>/.

Skipped, with the reason, when /usr/bin/chromium or the playwright package is missing
(`apt-get install chromium`; `pip install -e .[test]`). Never a downloaded browser.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
LAUNCH_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--no-first-run"]

try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover - depends on the machine
    sync_playwright = None
try:  # axe-core, the file its PyPI package ships (tests/browser/axe.py runs it)
    import axe_playwright_python
except ImportError:  # pragma: no cover - depends on the machine
    axe_playwright_python = None

# The widths every page is looked at (issue #16): a laptop, a wide screen, a phone.
WIDTHS = {"desktop": 1280, "wide": 1920, "phone": 390}

# Playwright's sync API keeps an event loop running in this thread; the ORM calls the
# tests make between browser steps are still synchronous code.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


def _missing() -> str:
    if sync_playwright is None:
        return "playwright is not installed (pip install -e .[test])"
    if not CHROMIUM.exists():
        return "Debian's chromium is not installed (apt-get install chromium): /usr/bin/chromium is missing"
    if axe_playwright_python is None:
        return "axe-playwright-python (axe-core) is not installed (pip install -e .[test])"
    return ""


def pytest_collection_modifyitems(config, items):
    reason = _missing()
    here = Path(__file__).parent
    for item in items:
        if item.path.is_relative_to(here):
            item.add_marker(pytest.mark.browser)
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def chromium():
    reason = _missing()
    if reason:
        pytest.skip(reason)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=LAUNCH_ARGS, headless=True)
        yield browser
        browser.close()


# Every page a journey opens must satisfy the Content-Security-Policy: the browser's
# securitypolicyviolation events and its console's CSP errors are collected per persona
# and fail the test (tests/browser/test_csp.py shows the collector catches one).
CSP_LISTENER = """document.addEventListener("securitypolicyviolation", (e) => window.__reportCspViolation({
  page: document.location.pathname, directive: e.violatedDirective, blocked: e.blockedURI,
  source: e.sourceFile, line: e.lineNumber, column: e.columnNumber, sample: e.sample}));"""


class Persona:
    """One signed-in user in their own browser context (own cookies)."""

    def __init__(self, context, page, name: str, base_url: str, journey: str):
        self.context, self.page, self.name, self.base_url, self.journey = context, page, name, base_url, journey
        self.csp_violations: list = []
        context.expose_binding("__reportCspViolation", lambda source, v: self.csp_violations.append(v))
        context.add_init_script(CSP_LISTENER)
        page.on("console", self._console)

    def _console(self, message) -> None:
        if "Content Security Policy" in message.text:
            self.csp_violations.append({"page": self.page.url, "console": message.text})

    def goto(self, path: str):
        return self.page.goto(self.base_url + path)

    def at_width(self, width: int) -> None:
        self.page.set_viewport_size({"width": width, "height": 900})

    def shot(self, label: str) -> Path:
        folder = ARTIFACTS / self.journey
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{len(list(folder.glob('*.png'))) + 1:02d}-{self.name}-{label}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path


@pytest.fixture
def as_user(chromium, live_server, personas, request):
    """as_user('alice') -> a Persona logged in through the login form."""
    journey = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower().removeprefix("test_")).strip("-")[:60]
    for old in (ARTIFACTS / journey).glob("*.png"):
        old.unlink()
    opened = []

    def login(name: str) -> Persona:
        context = chromium.new_context(viewport={"width": 1360, "height": 900}, accept_downloads=True,
                                       locale="en-GB", timezone_id="UTC")
        context.set_default_timeout(10_000)
        page = context.new_page()
        persona = Persona(context, page, name, live_server.url, journey)  # listens before the first page
        opened.append(persona)
        persona.goto("/login/")
        page.get_by_label("Username").fill(name)
        page.get_by_label("Password").fill("pw-" + name)
        page.get_by_role("button", name=re.compile("log in|sign in", re.I)).click()
        page.wait_for_url(live_server.url + "/")
        return persona

    yield login
    failed = getattr(request.node, "rep_call", None)
    for persona in opened:
        if failed is not None and failed.failed:
            try:
                persona.shot("FAILED")
            except Exception:  # noqa: BLE001 - best effort, the failure is already reported
                pass
        persona.context.close()
    if failed is not None and failed.passed:
        violations = [v for persona in opened for v in persona.csp_violations]
        assert not violations, f"pages violated the Content-Security-Policy: {violations}"


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    report = yield
    setattr(item, "rep_" + report.when, report)
    return report
