"""Alice files a 7-day cascade request from the form (the preview shown); olivia, sam and
rita approve from their inboxes; the runs complete and alice's request page follows them
live, without a reload: its header, approvals, actions, runs and progress each update in
place. Then the runs list and a run page, at three widths, with axe-core on each."""
from __future__ import annotations

import re

import pytest

from backfill_portal.backfills.models import ApprovalStep, BackfillRequest
from backfill_portal.execution.models import Run
from tests.browser.axe import serious_findings

# Without playwright the module is skipped with this reason (conftest skips without chromium).
expect = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e .[test])").expect
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def ready(catalog, demo_sources, task_queue, warehouse):
    return task_queue


def test_alice_files_a_cascade_request_owners_approve_and_the_page_follows_the_runs_live(as_user, ready):
    alice = as_user("alice")
    page = alice.page
    alice.goto("/requests/new/")
    page.get_by_label("Job", exact=True).select_option("dwd_order_items")
    page.get_by_label("First partition").fill("2022-10-01")
    page.get_by_label("Last partition").fill("2022-10-07")
    page.get_by_label("Reason").fill("late order events from the payment gateway, replayed on 2022-10-09")
    page.get_by_label("Cascade").select_option("cascade")
    preview = page.locator("#preview")
    expect(preview.get_by_test_id("interval-count")).to_have_text("7")
    expect(preview).to_contain_text("dws_sales_daily: rebuild")
    expect(preview).to_contain_text("notify_finance: skip")
    expect(preview).to_contain_text("monthly_summary: rebuild")
    for approver in ("olivia", "sam", "rita"):
        expect(preview.locator("ol.steps")).to_contain_text(approver)
    alice.shot("form-with-preview")
    page.get_by_role("button", name="Create and submit").click()
    page.wait_for_url(re.compile(r"/requests/\d+/$"))
    req = BackfillRequest.objects.get()
    expect(page.locator("h1 .pill")).to_have_text("pending approval")
    expect(page.get_by_role("status").filter(has_text="submitted for approval")).to_be_visible()
    alice.shot("submitted")
    page.evaluate("window.__sameDocument = true")  # a reload would lose it

    steps = {s.approver.username: s for s in ApprovalStep.objects.filter(request=req).select_related("approver")}
    assert set(steps) == {"olivia", "sam", "rita"}
    for name in ("olivia", "sam", "rita"):
        owner = as_user(name)
        expect(owner.page.locator("#nav-inbox-count")).to_contain_text("1")
        owner.page.get_by_role("link", name=re.compile("^Approvals")).click()
        card = owner.page.locator(f"#inbox-req-{req.pk}")
        expect(card).to_contain_text("2022-10-01 → 2022-10-07")
        expect(card).to_contain_text("late order events")
        expect(card.locator("svg.lineage title").first).to_contain_text(f"request #{req.pk}")
        expect(card.locator('svg.lineage [data-node="notify_finance"]')).to_have_class(re.compile("act-skip"))
        if name == "olivia":
            owner.shot("inbox")
        card.get_by_label("Comment").fill(f"{name}: checked the plan")
        card.get_by_role("button", name="Approve").click()
        expect(owner.page.locator(f"#inbox-req-{req.pk} [role=status]")).to_contain_text("You approved")
        expect(owner.page.locator("#nav-inbox-count")).to_contain_text("0")
        if name == "rita":
            owner.shot("last-approval")
    req.refresh_from_db()
    assert req.status in ("approved", "running")

    # Alice's page, never reloaded, followed the decisions: the header, every approval
    # step and the actions (a running request's requester may pause it).
    head = page.locator("#req-head h1 .pill").first
    expect(head).to_have_text(re.compile("^(approved|running)$"))
    expect(page.locator("#req-steps .pill-approved")).to_have_count(3)
    expect(page.locator("#req-steps .pill-pending")).to_have_count(0)
    expect(page.locator("#req-runs")).to_contain_text("No run yet")

    # The worker: run part of the work, then the rest; alice's page follows each time.
    ready.drain(limit=6)
    expect(head).to_have_text("running", timeout=15_000)
    expect(page.locator("#req-actions").get_by_role("button", name="Pause")).to_be_visible(timeout=15_000)
    expect(page.locator("#live .live-status .pill")).to_have_text("running")
    expect(page.locator("#live td.c.s-published").first).to_be_visible(timeout=15_000)
    first_run = Run.objects.filter(request=req).order_by("id").first()
    expect(page.locator(f'#req-runs a[href="/runs/{first_run.run_id}/"]')).to_be_visible(timeout=15_000)
    expect(page.locator("#req-runs")).not_to_contain_text("No run yet")
    assert not serious_findings(page)
    alice.shot("running-live")
    ready.drain()
    expect(head).to_have_text("reconciling", timeout=15_000)
    expect(page.locator("#live .live-status .pill")).to_have_text("reconciling")
    total = page.locator("#live td.c:not(.none)").count()
    expect(page.locator("#live td.c.s-published")).to_have_count(
        total - page.locator("#live td.c.s-skipped").count())
    expect(page.locator("#live")).to_contain_text("Open the reconciliation")
    expect(page.locator("#req-related").get_by_role("link", name=re.compile("review and sign off"))).to_be_visible()
    expect(page.locator("#req-actions").get_by_role("button", name="Pause")).to_have_count(0)
    expect(page.locator("#req-runs .pill-published").first).to_be_visible()
    assert "Reload" not in page.content()
    assert page.evaluate("window.__sameDocument") is True  # updated in place, never reloaded
    alice.shot("reconciling-live")
    for width in (1280, 1920, 390):
        page.set_viewport_size({"width": width, "height": 900})
        assert not serious_findings(page), width
        alice.shot(f"request-{width}px")
    page.set_viewport_size({"width": 1360, "height": 900})

    # The runs list and one run's page: what it read, wrote, rendered and logged.
    page.get_by_role("link", name="Runs", exact=True).click()
    expect(page.get_by_role("heading", name="Runs", exact=True)).to_be_visible()
    expect(page.locator("#runs-all")).to_contain_text(first_run.run_id)
    page.get_by_label("Job").select_option("dws_sales_daily")
    page.get_by_role("button", name="Filter").click()
    rows = page.locator("#runs-all tbody tr")
    expect(rows.first).to_contain_text("dws_sales_daily")
    assert all("dws_sales_daily" in text for text in rows.all_inner_texts())
    assert not serious_findings(page)
    for width in (1280, 1920, 390):
        page.set_viewport_size({"width": width, "height": 900})
        assert not serious_findings(page), width
        alice.shot(f"runs-{width}px")
    page.set_viewport_size({"width": 1360, "height": 900})
    rows.first.get_by_role("link", name=re.compile("^run_")).click()
    expect(page.locator("#phases-h")).to_be_visible()
    for phase in ("queued", "staging", "verifying", "publishing"):
        expect(page.locator(f'tr[data-phase="{phase}"]')).to_have_count(1)
    expect(page.locator("pre.sql")).to_contain_text("GROUP BY")
    expect(page.locator("table.log")).to_contain_text("published dws_sales_daily/")
    expect(page.locator("#inputs-h + .table-wrap")).to_contain_text("dwd_order_items")
    assert not serious_findings(page)
    for width in (1280, 1920, 390):
        page.set_viewport_size({"width": width, "height": 900})
        assert not serious_findings(page), width
        alice.shot(f"run-{width}px")
    page.set_viewport_size({"width": 1360, "height": 900})
    alice.goto(f"/requests/{req.pk}/")

    # The lineage of the request: drawn, highlighted, and the same nodes as a table.
    page.get_by_role("link", name="Lineage of this request").click()
    svg = page.locator("svg.lineage").first
    expect(svg.locator("title").first).to_contain_text(f"highlighting request #{req.pk}")
    expect(svg.locator('[data-node="dwd_order_items"]')).to_have_class(re.compile("act-target"))
    expect(svg.locator('[data-node="dws_sales_daily"]')).to_have_class(re.compile("act-rebuild"))
    expect(svg.locator('[data-node="notify_finance"]')).to_have_class(re.compile("ln-side_effect.*act-skip"))
    expect(page.get_by_role("table")).to_contain_text("monthly_summary")
    alice.shot("lineage")
