"""The approver's view of a request: the code version and its diff against the code
that produced the published partitions (with who deployed it and why), the first
interval's rendered SQL, the warehouse's estimate and past durations, and the
partitions that will change."""
from __future__ import annotations

import pytest
from django.urls import reverse

from backfill_portal.backfills.services.requests import backfill_request_create, backfill_request_submit
from backfill_portal.catalog.services.sync import catalog_sync
from backfill_portal.execution.models import Run
from tests.reconciliation.helpers import DOUBLED_SQL, catalog_text, run_request

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def changed_code(personas, pipeline):
    """Two days published with the good code, then the append-style code deployed by
    olivia with a reason, and alice's pending request over three days with it."""
    good = run_request(personas, pipeline, start="2022-10-01", end="2022-10-02")
    catalog_sync(text=catalog_text(dwd_sql=DOUBLED_SQL), actor=personas["olivia"],
                 reason="INC-2211: append late events instead of recomputing the day")
    req, _ = backfill_request_create(actor=personas["alice"], job="dwd_order_items", start="2022-10-01",
                                     end="2022-10-03", reason="pick up late events")
    backfill_request_submit(actor=personas["alice"], request_id=req.pk, confirm_overlap=True)
    return good, req


def test_the_review_shows_the_diff_the_rendered_sql_the_estimate_and_the_partitions(web, changed_code):
    good, req = changed_code
    html = web("olivia").get(reverse("approval-review", args=[req.pk])).content.decode()
    published = Run.objects.filter(request=good).select_related("code_version").first().code_version
    req.refresh_from_db()
    diff = html.split('class="diff code-diff"')[1].split("</pre>")[0]
    assert f"published: {published.short_hash}" in diff and f"this request: {req.code_version.short_hash}" in diff
    assert '<span class="d-add">+) AS l CROSS JOIN' in diff and '<span class="d-del">-' in diff
    assert "which produced 2 of the published partitions (2022-10-01, 2022-10-02)" in html
    assert "Made the job's code by <strong>olivia</strong>" in html
    assert "INC-2211: append late events instead of recomputing the day" in html
    sql = html.split('id="rendered-sql"')[1].split("</section>")[0]
    assert "Rendered SQL of the first interval: <span class=\"mono\">2022-10-01</span>" in sql
    assert "ods_order_events" in sql and "{{" not in sql and "2022-09-30 16:00:00" in sql  # Shanghai midnight, UTC
    estimate = html.split('id="estimate"')[1].split("</section>")[0]
    assert ("SQLite estimate" in estimate and "no row or cost estimate" in estimate) or "rows, cost" in estimate
    assert "Query plan" in estimate
    assert "median" in html and "last 2 published runs" in html
    changes = html.split('class="changes"')[1].split("</table>")[0]
    good_runs = {r.partition_key: r.run_id for r in Run.objects.filter(request=good)}
    assert good_runs["2022-10-01"] in changes and good_runs["2022-10-02"] in changes
    assert changes.count("other code") == 2 and "nothing yet" in changes  # 2022-10-03 is new
    assert "(1 not published yet)" in html
    # Olivia decides from the review page itself.
    assert 'name="decision" value="approve"' in html


def test_the_inbox_card_names_the_code_version_and_links_the_review(web, changed_code):
    _, req = changed_code
    req.refresh_from_db()
    html = web("olivia").get("/approvals/").content.decode()
    assert req.code_version.short_hash in html
    assert f'href="{reverse("approval-review", args=[req.pk])}"' in html


def test_same_code_says_so_and_an_unknown_request_is_a_404(web, personas, pipeline):
    run_request(personas, pipeline, start="2022-10-01", end="2022-10-01")
    req, _ = backfill_request_create(actor=personas["alice"], job="dwd_order_items", start="2022-10-01",
                                     end="2022-10-01", reason="again")
    backfill_request_submit(actor=personas["alice"], request_id=req.pk, confirm_overlap=True)
    html = web("olivia").get(reverse("approval-review", args=[req.pk])).content.decode()
    assert "1 published partition was produced by this same code" in html and 'class="diff code-diff"' not in html
    assert web("olivia").get("/approvals/requests/999999/").status_code == 404
    assert web("audrey").get(reverse("approval-review", args=[req.pk])).status_code == 200  # reads everything
