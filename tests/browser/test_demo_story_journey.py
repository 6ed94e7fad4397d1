"""The demo's first start tells the 2 a.m. incident (web/demo/story.py), and a new user
can act on it in the browser: the anomaly is on the home page, alice files the
corrective backfill from it, olivia reviews the code diff and the rendered SQL before
approving, the correction reconciles as matched with the incident partition's before
at twice its rows, and a rollback is then named on the reconciliation.

`load_demo` runs for real (the command), at a small scale so the test stays short."""
from __future__ import annotations

import re
from io import StringIO

import pytest
from django.core.management import call_command

from backfill_portal.backfills.models import BackfillRequest, ReconciliationRow
from backfill_portal.execution.choices import RunStatus, RunType
from backfill_portal.execution.models import Run
from backfill_portal.recovery.rollback import request_rollback
from backfill_portal.web.demo.story import INCIDENT_DAY, INCIDENT_JOB, INCIDENT_KEY

expect = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e .[test])").expect
pytestmark = pytest.mark.django_db(transaction=True)


def load_demo() -> str:
    out = StringIO()
    call_command("load_demo", "--orders-per-day", "40", "--page-views-per-hour", "4", "--first", "2022-09-01",
                 "--last", "2022-11-30", stdout=out)
    return out.getvalue()


def test_the_demo_tells_the_incident_and_the_corrective_backfill_reconciles_it(
        as_user, personas, warehouse, task_queue):
    output = load_demo()
    assert "story: the 2 a.m. incident" in output
    assert "told on an earlier start" in load_demo()  # the second start tells nothing again
    incident = BackfillRequest.objects.get(idempotency_key=INCIDENT_KEY)
    assert incident.status == "reconciling"
    history = Run.objects.filter(job__name=INCIDENT_JOB, run_type=RunType.SCHEDULED)
    assert history.count() == 91 and not history.filter(status=RunStatus.FAILED).exists()
    doubled = Run.objects.get(request=incident).version.row_count
    (incident_row,) = ReconciliationRow.objects.filter(request=incident)
    assert incident_row.rows_after == doubled == 2 * incident_row.rows_before  # the scheduled version, doubled
    assert incident_row.verdict == "unexplained" and "baseline" in incident_row.deviations[0]

    alice = as_user("alice")
    page = alice.page
    anomaly = page.locator(f'#anomalies li[data-dataset="{INCIDENT_JOB}"][data-partition="{INCIDENT_DAY}"]')
    expect(anomaly).to_contain_text(re.compile(r"[12]\.\dx baseline"))  # ~2x; small days are noisy
    expect(anomaly).to_contain_text(f"({doubled} rows;")
    expect(anomaly).to_contain_text(f"request #{incident.pk}")
    alice.shot("home-anomaly")
    anomaly.get_by_role("link", name="File the corrective backfill").click()
    page.wait_for_url(re.compile(r"/requests/new/"))
    expect(page.get_by_label("First partition")).to_have_value(INCIDENT_DAY)
    expect(page.get_by_label("Last partition")).to_have_value(INCIDENT_DAY)
    page.get_by_label("Reason").fill("INC-2211: republish 2022-11-22 with the deduplicating SELECT")
    page.get_by_role("button", name="Create and submit").click()
    # The incident's request is still reconciling the same day: the form asks to confirm.
    expect(page.get_by_role("alert").filter(has_text="overlaps an active request")).to_be_visible()
    page.get_by_label("Submit although it overlaps an active request").check()
    page.get_by_role("button", name="Create and submit").click()
    page.wait_for_url(re.compile(r"/requests/\d+/$"))
    corrective = BackfillRequest.objects.exclude(pk=incident.pk).filter(requested_by__username="alice").latest("pk")
    assert corrective.status == "pending_approval"

    olivia = as_user("olivia")
    olivia.goto("/approvals/")
    olivia.page.get_by_role("link", name=re.compile(f"Review the code diff.*request #{corrective.pk}")).click()
    olivia.page.wait_for_url(re.compile(rf"/approvals/requests/{corrective.pk}/$"))
    diff = olivia.page.locator("pre.code-diff")
    expect(diff).to_contain_text("#appended")  # the append-style code that produced what readers see
    expect(diff.locator(".d-del").filter(has_text="CROSS JOIN")).to_have_count(1)
    # Who deployed the code that produced what readers see, and why; and who reverted it.
    expect(olivia.page.locator(".review-job")).to_contain_text("INC-2211 at 02:00")
    expect(olivia.page.locator(".review-job")).to_contain_text("INC-2211 revert")
    sql = olivia.page.locator("#rendered-sql pre")
    expect(sql).to_contain_text("ROW_NUMBER() OVER")
    expect(sql).to_contain_text("ods_order_events")
    expect(sql).not_to_contain_text("{{")
    expect(olivia.page.locator("table.changes")).to_contain_text(INCIDENT_DAY)
    expect(olivia.page.locator("#estimate")).to_contain_text("estimate")
    olivia.shot("review")
    olivia.page.get_by_role("button", name="Approve").click()
    expect(olivia.page.locator(f"#inbox-req-{corrective.pk} .alert")).to_contain_text("You approved")
    task_queue.drain()
    corrective.refresh_from_db()
    assert corrective.status == "reconciling"

    alice.goto(f"/requests/{corrective.pk}/reconciliation/")
    row = ReconciliationRow.objects.get(request=corrective)
    assert row.verdict == "matched" and row.rows_before == doubled == 2 * row.rows_after
    assert row.rows_baseline == pytest.approx(row.rows_after, rel=0.5)
    tr = page.locator(f"#rec-row-{row.pk}")
    expect(tr.locator(".pill-v-matched")).to_be_visible()
    expect(tr).to_contain_text(str(doubled))
    expect(page.locator("#verdict-counts")).to_contain_text("matched 1")
    alice.shot("reconciled")
    alice.goto("/")
    expect(page.locator(f'#anomalies li[data-partition="{INCIDENT_DAY}"]')).to_have_count(0)

    # The on-call rolls the correction back (the request page's form is the live part's;
    # the service is what it calls): the reconciliation names what went back.
    request_rollback(actor=personas["oscar"], request_id=corrective.pk, reason="demo: undo the correction")
    oscar = as_user("oscar")
    oscar.goto(f"/requests/{corrective.pk}/reconciliation/")
    rolled = oscar.page.locator(".exceptions > li").filter(has_text="rolled back")
    expect(rolled).to_contain_text(f"{INCIDENT_JOB} {INCIDENT_DAY}")
    expect(rolled).to_contain_text("by oscar")
    oscar.shot("rolled-back")
