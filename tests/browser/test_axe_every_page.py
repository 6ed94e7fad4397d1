"""Every page of the console, as the persona who uses it, through axe-core at 1280 and
390 px: no serious and no critical finding (issue #16 item 11). At 390 px the page
itself never scrolls sideways (wide tables, drawings and the calendar scroll inside
their own keyboard-reachable regions); at 1920 px the content uses the screen's width
(item 6). Screenshots at 1280, 1920 and 390 px under test-artifacts/every-page-*/.

A page added to web_urls.py without an entry in PAGES (or NOT_PAGES, for the POST
actions and fragments) fails test_every_page_of_the_console_is_checked."""
from __future__ import annotations

import re
from datetime import datetime, timezone as tz

import pytest

from backfill_portal.backfills.services.requests import backfill_request_create, backfill_request_submit
from backfill_portal.catalog.models import Job
from backfill_portal.execution.models import Run
from backfill_portal.execution.services.schedule import schedule_production
from backfill_portal.recovery.rollback import partition_rollback
from backfill_portal.web_urls import urlpatterns
from tests.browser.axe import serious_findings
from tests.browser.conftest import WIDTHS, Persona
from tests.browser.scenarios import doubled_incident

expect = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e .[test])").expect
pytestmark = pytest.mark.django_db(transaction=True)

# POST-only actions, the polled fragment and the log-out: not pages a person opens.
NOT_PAGES = {
    "logout", "request-preview", "request-live", "request-submit", "request-approve", "request-reject",
    "request-cancel", "request-pause", "request-resume", "request-retry", "request-rollback",
    "reconciliation-explain", "reconciliation-signoff", "reconciliation-recompute", "approval-step-decide",
    "handoff-decide", "partition-rebuild-consumers", "catalog-job-stale-draft", "reconciliation-explain-many",
}


# /api/docs/ is drf-spectacular's Swagger UI page, vendored whole (drf-spectacular-sidecar).
# axe checks it like every page (templates/drf_spectacular/swagger_ui.html sets its
# language and the badges' contrast; deep links are off, so no link nests in a button),
# but its layout is upstream's: it is left out of the 390 px overflow check.
THIRD_PARTY = {"api-docs"}
# Photographed at 1280, 1920 and 390 px (every page is checked; these are looked at).
PHOTOGRAPHED = {"home", "run-list", "request-detail", "request-calendar", "reconciliation", "approvals", "run-detail", "lineage",
                "audit", "dataset"}
# The outermost elements sticking out of the viewport: what makes a page scroll sideways.
WIDEST = """[...document.querySelectorAll('body *')].filter(e => e.getBoundingClientRect().right > innerWidth + 1
  && e.parentElement.getBoundingClientRect().right <= innerWidth + 1).slice(0, 5)
  .map(e => e.tagName.toLowerCase() + (e.id ? '#' + e.id : '') + '.' + [...e.classList].join('.'))"""


def pages(ids: dict) -> list[tuple[str, str, str]]:
    """(url name, persona, path): every page, opened by the persona it is for."""
    bad, hourly, pending, failed = ids["bad"], ids["hourly"], ids["pending"], ids["failed"]
    return [
        ("home", "oscar", "/"), ("home", "olivia", "/"), ("home", "alice", "/"), ("home", "audrey", "/"),
        ("request-list", "alice", "/requests/"),
        ("request-new", "alice", "/requests/new/?job=dwd_order_items"),
        ("request-new", "audrey", "/requests/new/"),  # the 403 page
        ("request-detail", "alice", f"/requests/{bad}/"),
        ("request-detail", "olivia", f"/requests/{pending}/"),
        ("request-calendar", "alice", f"/requests/{hourly}/calendar/"),
        ("request-calendar", "alice", f"/requests/{hourly}/calendar/?job=page_views_hourly&within=2022-11"),
        # the fall-back day: its repeated hour's two columns carry their offsets
        ("request-calendar", "alice", f"/requests/{hourly}/calendar/?job=page_views_hourly&within=2022-11-06"),
        ("request-calendar", "alice", f"/requests/{hourly}/calendar/?within=nope"),  # the 400 page
        ("reconciliation", "olivia", f"/requests/{bad}/reconciliation/"),
        ("approvals", "olivia", "/approvals/"),
        ("approval-review", "olivia", f"/approvals/requests/{pending}/"),
        ("run-list", "oscar", "/runs/"),
        ("run-list", "oscar", "/runs/?state=failing"),
        ("run-detail", "oscar", f"/runs/{failed}/"),
        ("outbox", "oscar", "/outbox/"),
        ("catalog", "alice", "/catalog/"),
        ("catalog-job", "alice", "/catalog/jobs/dwd_order_items/"),
        ("catalog-job-stale", "olivia", "/catalog/jobs/dwd_order_items/stale/"),
        ("lineage", "alice", "/lineage/"),
        ("lineage", "olivia", f"/lineage/?request={pending}"),
        ("dataset", "oscar", "/datasets/dwd_order_items/"),
        ("partition", "oscar", "/datasets/dwd_order_items/partitions/2022-10-01/"),
        ("partition-rollback-confirm", "oscar", "/datasets/dwd_order_items/partitions/2022-10-02/rollback/"),
        ("audit", "audrey", "/audit/"),
        ("api-docs", "alice", "/api/docs/"),
        ("not-found", "alice", "/requests/999999/"),
    ]


def test_every_page_of_the_console_is_checked():
    named = {p.name for p in urlpatterns if p.name} - NOT_PAGES
    checked = {name for name, _, _ in pages({"bad": 1, "hourly": 2, "pending": 3, "failed": "run_x"})}
    checked.add("login")  # signed out, at the end of the test below
    assert named - checked == set(), "add these pages to PAGES in tests/browser/test_axe_every_page.py"


def the_console_in_use(personas, queue) -> dict:
    """What a console holds after a day of use: the doubled incident reconciling, one of
    its partitions rolled back (a consumer built from it), a scheduled run that failed,
    a cascade waiting for its owners, and a long hourly request (an aggregated calendar)."""
    _, bad, _ = doubled_incident(personas, queue, good_range=("2022-10-01", "2022-10-02"),
                                 bad_range=("2022-10-01", "2022-10-02"), with_consumer=True)
    partition_rollback(actor=personas["oscar"], dataset="dwd_order_items", partition_key="2022-10-01",
                       reason="doubled by the 02:00 deploy")
    Job.objects.filter(name="dwd_order_items").update(scheduled=True)
    [failed] = schedule_production(now=datetime(2030, 1, 2, 2, 0, tzinfo=tz.utc))
    queue.drain()
    alice = personas["alice"]
    pending, _ = backfill_request_create(actor=alice, job="dwd_order_items", start="2022-10-05", end="2022-10-07",
                                         reason="late order events from the payment gateway", cascade="cascade")
    backfill_request_submit(actor=alice, request_id=pending.pk, confirm_overlap=True)
    hourly, _ = backfill_request_create(actor=alice, job="page_views_hourly", start="2022-10-01T00:00-04:00",
                                        end="2022-12-31T23:00-05:00", reason="bot filter fixed upstream")
    return {"bad": bad.pk, "hourly": hourly.pk, "pending": pending.pk, "failed": failed}


def test_every_page_passes_axe_and_fits_390_px(as_user, chromium, live_server, personas, demo_sources, task_queue,
                                               warehouse):
    ids = the_console_in_use(personas, task_queue)
    signed_in: dict[str, Persona] = {}
    findings, overflow = [], []
    for name, who, path in pages(ids):
        persona = signed_in.get(who) or signed_in.setdefault(who, as_user(who))
        page = persona.page
        label = re.sub(r"[^a-z0-9]+", "-", f"{name}-{path}".lower()).strip("-")[:70]
        for width in (WIDTHS["desktop"], WIDTHS["wide"], WIDTHS["phone"]):
            persona.at_width(width)
            persona.goto(path)
            if name in PHOTOGRAPHED:
                persona.shot(f"{label}-{width}")
            if width == WIDTHS["wide"]:
                continue
            findings += [f"{who} at {width} px: {f}" for f in serious_findings(page)]
            if width == WIDTHS["phone"] and name not in THIRD_PARTY:
                scroll = page.evaluate("document.documentElement.scrollWidth")
                if scroll > width + 1:
                    overflow.append((path, who, scroll, page.evaluate(WIDEST)))
    anonymous = chromium.new_context(viewport={"width": WIDTHS["phone"], "height": 900})
    try:
        login = Persona(anonymous, anonymous.new_page(), "anonymous", live_server.url, "every-page-login")
        login.goto("/login/")
        findings += serious_findings(login.page)
        login.shot("login-390")
    finally:
        anonymous.close()
    assert findings == [], f"axe-core found serious or critical problems: {findings}"
    assert overflow == [], f"pages wider than 390 px (path, persona, scrollWidth, what sticks out): {overflow}"


def test_wide_screens_phones_and_keyboards_get_the_whole_console(as_user, personas, demo_sources, task_queue,
                                                                 warehouse):
    ids = the_console_in_use(personas, task_queue)
    oscar = as_user("oscar")
    page = oscar.page
    # The failures panel lists the failed scheduled run, linked.
    oscar.goto("/")
    failures = page.locator("#failures")
    expect(failures).to_contain_text(ids["failed"])
    expect(failures.get_by_role("row", name=re.compile(ids["failed"]))).to_contain_text("scheduled")
    # 1920 px: the content uses the screen, not a 1280 px column.
    oscar.at_width(WIDTHS["wide"])
    oscar.goto("/audit/")
    assert page.evaluate("document.querySelector('main').getBoundingClientRect().width") > 1800
    # A calendar cell links to its run.
    oscar.at_width(WIDTHS["desktop"])
    oscar.goto(f"/requests/{ids['bad']}/")
    cell = page.locator("#live td.c a").first
    href = cell.get_attribute("href")
    assert re.fullmatch(r"/runs/run_[0-9a-f]+/", href)
    cell.click()
    page.wait_for_url(re.compile(re.escape(href) + "$"))
    expect(page.locator("h1")).to_contain_text(href.split("/")[2])
    # 390 px: the lineage drawing pans with the keyboard inside its own region.
    oscar.at_width(WIDTHS["phone"])
    olivia = as_user("olivia")
    olivia.at_width(WIDTHS["phone"])
    olivia.goto(f"/lineage/?request={ids['pending']}")
    drawing = olivia.page.locator(".lineage-wrap")
    drawing.focus()
    assert drawing.evaluate("el => el.scrollWidth > el.clientWidth")
    for _ in range(5):
        olivia.page.keyboard.press("ArrowRight")
    # Chromium scrolls by key smoothly: the position moves over the next frames.
    olivia.page.wait_for_function("el => el.scrollLeft > 0", arg=drawing.element_handle(), timeout=10_000)
    olivia.shot("lineage-panned-390")
    # The approvals inbox's small drawing is a region a keyboard reaches too.
    olivia.goto("/approvals/")
    inbox = olivia.page.locator(".inbox-lineage .lineage-wrap").first
    assert inbox.get_attribute("tabindex") == "0"
    assert Run.objects.filter(run_id=ids["failed"]).exists()
