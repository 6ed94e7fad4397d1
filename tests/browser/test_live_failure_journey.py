"""A failure, followed live: alice watches her dws_sales_daily request while sam approves
it and the worker runs it. A code change had made the rollup lose a category, so the
attempt succeeds but verification refuses the version. Without a reload, the header, the
approvals, the actions and the runs follow, the error shows in the run's row, Retry
appears saying it reruns the frozen code, and polling stops. The run page says why a
succeeded attempt did not publish; the runs list puts it under Failing."""
from __future__ import annotations

import re

import pytest

from backfill_portal.backfills.services.requests import (
    backfill_request_create,
    backfill_request_decide,
    backfill_request_submit,
)
from backfill_portal.catalog.services.sync import catalog_sync
from backfill_portal.execution.models import Run
from tests.browser.axe import serious_findings
from tests.conftest import TEST_CATALOG
from tests.execution.test_pipeline import approved_request

expect = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e .[test])").expect
pytestmark = pytest.mark.django_db(transaction=True)

LOSING = TEST_CATALOG.replace("FROM {{ ref('dwd_order_items') }} AS d GROUP BY category",
                              "FROM {{ ref('dwd_order_items') }} AS d WHERE category <> 'books' GROUP BY category")


@pytest.fixture
def ready(catalog, demo_sources, task_queue, warehouse, settings, tmp_path):
    settings.RUN_LOG_DIR = str(tmp_path / "runs")
    return task_queue


def test_a_verification_failure_shows_where_it_happened_without_a_reload(as_user, personas, ready):
    approved_request(personas, start="2022-10-01", end="2022-10-01")
    ready.drain()
    assert LOSING != TEST_CATALOG
    catalog_sync(text=LOSING)
    req, _ = backfill_request_create(actor=personas["alice"], job="dws_sales_daily", start="2022-10-01",
                                     end="2022-10-01", reason="rebuild after the category fix")
    backfill_request_submit(actor=personas["alice"], request_id=req.pk, confirm_overlap=True)

    alice = as_user("alice")
    page = alice.page
    alice.goto(f"/requests/{req.pk}/")
    head = page.locator("#req-head h1 .pill").first
    expect(head).to_have_text("pending approval")
    expect(page.locator("#req-steps .pill-pending")).to_have_count(1)
    page.evaluate("window.__sameDocument = true")  # a reload would lose it
    assert not serious_findings(page)

    backfill_request_decide(actor=personas["sam"], request_id=req.pk, approve=True, comment="go ahead")
    expect(head).to_have_text(re.compile("^(approved|running)$"))
    expect(page.locator("#req-steps")).to_contain_text("go ahead")
    expect(page.locator("#req-steps .pill-approved")).to_have_count(1)

    ready.drain()
    run = Run.objects.get(request=req)
    assert run.status == "verification_failed"
    expect(head).to_have_text("failed", timeout=15_000)
    row = page.locator(f'#req-runs tr[data-run="{run.run_id}"]')
    expect(row.locator(".pill")).to_have_text("verification failed")
    expect(row.locator(".run-error")).to_contain_text("measure_vs_source")
    retry = page.locator("#req-actions").get_by_role("button", name="Retry failed intervals")
    expect(retry).to_be_visible()
    note = page.get_by_test_id("retry-note")
    expect(note).to_contain_text("reruns the failed intervals with the code version frozen at submission")
    expect(note.get_by_role("link", name="file a new request with the current code")).to_be_visible()
    expect(page.locator("#req-poll")).not_to_have_attribute("hx-get", re.compile("."))  # polling stopped
    assert page.evaluate("window.__sameDocument") is True
    assert not serious_findings(page)
    alice.shot("failed-live")

    page.locator(f'#req-runs a[href="/runs/{run.run_id}/"]').click()
    verdict = page.locator("#run-verdict")
    expect(verdict).to_contain_text("The attempt succeeded: it wrote the version and its commit marker")
    expect(verdict).to_contain_text("measure_vs_source")
    expect(page.locator("pre.sql")).to_contain_text("category <> 'books'")
    expect(page.locator("table.log")).to_contain_text("verification failed")
    assert not serious_findings(page)
    alice.shot("run-verification-failed")

    alice.goto("/runs/")
    expect(page.locator("#runs-failing")).to_contain_text(run.run_id)
    alice.shot("runs-failing")

    alice.goto(f"/requests/{req.pk}/")
    page.get_by_role("link", name="file a new request with the current code").click()
    expect(page.get_by_label("Job", exact=True)).to_have_value("dws_sales_daily")
    expect(page.get_by_label("First partition")).to_have_value("2022-10-01")
    expect(page.get_by_label("Last partition")).to_have_value("2022-10-01")
    expect(page.locator("#preview").get_by_test_id("interval-count")).to_have_text("1")
    alice.shot("new-request-prefilled")
