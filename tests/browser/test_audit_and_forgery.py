"""Audrey (auditor) finds the whole story in the audit history and exports it; and
forged POSTs from a real browser session are refused: another user's approval with a
valid CSRF token (403, recorded) and any POST without a token (403, CSRF)."""
from __future__ import annotations

import csv
import io

import pytest

from backfill_portal.backfills.models import ApprovalStep, ReconciliationRow
from backfill_portal.recovery.reconciliation import (
    interval_explain,
    reconciliation_compute,
    reconciliation_signoff,
)
from backfill_portal.backfills.services.requests import backfill_request_create, backfill_request_submit
from backfill_portal.core.models import AuditEvent
from backfill_portal.recovery.rollback import partition_rollback
from tests.browser.scenarios import doubled_incident

# Without playwright the module is skipped with this reason (conftest skips without chromium).
expect = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e .[test])").expect
pytestmark = pytest.mark.django_db(transaction=True)

FETCH = """async ([url, body, token]) => {
  const headers = {"Content-Type": "application/x-www-form-urlencoded"};
  if (token) headers["X-CSRFToken"] = token;
  const response = await fetch(url, {method: "POST", body, headers, credentials: "same-origin"});
  return {status: response.status, text: await response.text()};
}"""


def csrf_token(page) -> str:
    return page.evaluate("JSON.parse(document.body.getAttribute('hx-headers'))['X-CSRFToken']")


def test_audrey_finds_the_story_in_the_audit_history_and_exports_it(
        as_user, personas, demo_sources, task_queue, warehouse):
    _, bad, _ = doubled_incident(personas, task_queue, good_range=("2022-10-01", "2022-10-02"),
                                 bad_range=("2022-10-01", "2022-10-02"), with_consumer=True)
    reconciliation_compute(actor=None, request_id=bad.pk)
    for row in ReconciliationRow.objects.filter(request=bad, verdict="unexplained"):
        interval_explain(actor=personas["olivia"], request_id=bad.pk, partition_key=row.partition_key,
                         explanation="doubled by the 02:00 deploy")
    reconciliation_signoff(actor=personas["olivia"], request_id=bad.pk, comment="explained")
    partition_rollback(actor=personas["oscar"], dataset="dwd_order_items", partition_key="2022-10-01",
                       reason="amounts doubled")

    audrey = as_user("audrey")
    page = audrey.page
    page.get_by_role("link", name="Audit").click()
    page.get_by_label("Request #").fill(str(bad.pk))
    page.get_by_role("button", name="Filter").click()
    table = page.locator("main table")
    for action in ("request.submit", "approval_step.approved", "request.approve", "run.published", "reconciliation.explain",
                   "request.signoff", "partition.rollback", "run.rolled_back", "request.reopen"):
        expect(table).to_contain_text(action)
    expect(table).to_contain_text("amounts doubled")
    audrey.shot("audit-by-request")
    page.get_by_label("Action starts with").fill("partition.")
    page.get_by_role("button", name="Filter").click()
    expect(table.locator("tbody tr")).to_have_count(1)
    expect(table).to_contain_text("oscar")

    page.get_by_label("Action starts with").fill("")
    page.get_by_role("button", name="Filter").click()
    with page.expect_download() as download:
        page.get_by_role("link", name="Export CSV").click()
    rows = list(csv.DictReader(io.StringIO(open(download.value.path(), encoding="utf-8").read())))
    assert rows and {r["request_id"] for r in rows} == {str(bad.pk)}
    actions = {r["action"] for r in rows}
    assert {"request.submit", "request.signoff", "partition.rollback", "reconciliation.explain"} <= actions
    assert len(rows) == AuditEvent.objects.filter(request_id=bad.pk).count()

    # An auditor reads everything and is offered no action.
    audrey.goto(f"/requests/{bad.pk}/")
    expect(page.locator("#actions-h")).to_have_count(0)
    audrey.goto("/datasets/dwd_order_items/partitions/2022-10-02/")
    expect(page.get_by_role("link", name="Roll back…")).to_have_count(0)
    audrey.goto(f"/requests/{bad.pk}/reconciliation/")
    # The rollback took a signed-off interval away: the request was reopened, its sign-off
    # withdrawn (the audit above shows both), and the interval awaits an explanation.
    expect(page.locator("#signoff")).to_contain_text("1 interval is unexplained")
    audrey.shot("reconciliation-read-only")


def test_forged_posts_from_the_browser_are_refused(as_user, personas, catalog):
    req, _ = backfill_request_create(actor=personas["alice"], job="dwd_order_items", start="2022-10-01",
                                     end="2022-10-03", reason="late events")
    backfill_request_submit(actor=personas["alice"], request_id=req.pk)
    step = ApprovalStep.objects.get(request=req)
    assert step.approver.username == "olivia"
    url = f"/approvals/steps/{step.pk}/decide/"

    alice = as_user("alice")
    alice.goto("/approvals/")
    expect(alice.page.locator(f"#inbox-req-{req.pk}")).to_have_count(0)  # never offered
    forged = alice.page.evaluate(FETCH, [url, "decision=approve&comment=lgtm", csrf_token(alice.page)])
    assert forged["status"] == 403 and "nobody approves a step of their own request" in forged["text"]

    sam = as_user("sam")  # an owner, but not of this dataset
    forged = sam.page.evaluate(FETCH, [url, "decision=approve", csrf_token(sam.page)])
    assert forged["status"] == 403 and "this step is for olivia" in forged["text"]

    olivia = as_user("olivia")  # the approver herself, without a CSRF token
    no_token = olivia.page.evaluate(FETCH, [url, "decision=approve", None])
    assert no_token["status"] == 403 and "CSRF" in no_token["text"]
    olivia.goto(url.replace("/decide/", "/"))  # a GET of an action is not an action either
    step.refresh_from_db()
    assert step.status == "pending"
    assert set(AuditEvent.objects.filter(action="denied.approval.approve").values_list("actor_name", flat=True)) == {
        "alice", "sam"}

    # The same form, submitted normally by olivia, works: the token is what made the difference.
    olivia.goto("/approvals/")
    card = olivia.page.locator(f"#inbox-req-{req.pk}")
    card.get_by_role("button", name="Reject").click()
    expect(card.locator(".errorlist")).to_contain_text("say why you reject")
    olivia.shot("reject-needs-a-comment")
    card = olivia.page.locator(f"#inbox-req-{req.pk}")
    card.get_by_label("Comment").fill("the gateway replay is not finished; file it again tomorrow")
    card.get_by_role("button", name="Reject").click()
    expect(olivia.page.locator(f"#inbox-req-{req.pk} [role=status]")).to_contain_text("You rejected")
    step.refresh_from_db()
    assert step.status == "rejected"
