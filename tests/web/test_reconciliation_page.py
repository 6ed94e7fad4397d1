"""The reconciliation page: the manifest, the four numbers with their verdicts, inline
explanations (htmx returns the row and, out of band, the counts and the sign-off panel),
sign-off refused while anything is unexplained, CSV export, and the chart."""
from __future__ import annotations

import csv
import io

import pytest
from django.test import Client
from django.urls import reverse

from backfill_portal.backfills.models import ReconciliationRow
from backfill_portal.core.models import AuditEvent

pytestmark = pytest.mark.django_db(transaction=True)


def url(req, name="reconciliation", *args) -> str:
    return reverse(name, args=[req.pk, *args])


@pytest.fixture
def doubled(personas, pipeline):
    from tests.browser.scenarios import doubled_incident

    _, bad, _ = doubled_incident(personas, pipeline, good_range=("2022-09-28", "2022-10-02"),
                                 bad_range=("2022-10-01", "2022-10-02"))
    return bad


def test_page_shows_manifest_four_numbers_chart_and_a_disabled_signoff_with_the_reason(web, doubled):
    html = web("olivia").get(url(doubled)).content.decode()
    manifest = html.split('id="manifest-h"')[1].split("</section>")[0]
    assert "Intervals planned" in manifest and ">2 <span" in manifest and "2 published" in manifest
    assert "published more than once" in manifest and "superseded by another request" in manifest
    assert html.count('class="v-unexplained"') == 2 and html.count("pill-v-unexplained\">unexplained") == 3
    assert "beyond ±50%" in html  # the deviation, in words
    assert 'disabled aria-describedby="signoff-blocked"' in html
    assert "2 intervals are unexplained: explain every difference before signing off." in html
    assert '<svg role="img" aria-labelledby="chart-1-t chart-1-d"' in html
    assert html.count('class="chart-after"') == 2 and html.count('class="chart-before"') == 2
    assert "chart-baseline-line" in html and "Rows per interval of dwd_order_items: 2022-10-01: before" in html
    assert f'href="/api/requests/{doubled.pk}/reconciliation/?format=csv"' in html
    assert html.count("Save explanation") == 2


def test_request_detail_links_the_reconciliation_when_reconciling(web, doubled, make_request):
    assert f'href="{url(doubled)}"' in web("alice").get(reverse("request-detail", args=[doubled.pk])).content.decode()
    pending = make_request("pending", start="2021-01-01", end="2021-01-02")
    detail = web("alice").get(reverse("request-detail", args=[pending.pk])).content.decode()
    assert "/reconciliation/" not in detail
    page = web("alice").get(url(pending)).content.decode()
    assert "Nothing ran yet: the request is pending approval." in page


def test_explaining_with_htmx_returns_the_row_and_updates_counts_and_signoff_out_of_band(web, doubled):
    rows = list(ReconciliationRow.objects.filter(request=doubled).order_by("partition_key")) or None
    if rows is None:  # computed on first read
        web("olivia").get(url(doubled))
        rows = list(ReconciliationRow.objects.filter(request=doubled).order_by("partition_key"))
    client = web("olivia")
    first = client.post(url(doubled, "reconciliation-explain", rows[0].pk),
                        {"explanation": "doubled by the 02:00 deploy"}, HTTP_HX_REQUEST="true")
    assert first.status_code == 200
    html = first.content.decode()
    assert html.lstrip().startswith(f'<tr id="rec-row-{rows[0].pk}" class="v-explained">')
    assert "“doubled by the 02:00 deploy”" in html and "— olivia" in html
    assert "<template>" in html and '<section class="card verdicts" id="verdict-counts"' in html
    assert 'id="signoff" aria-labelledby="signoff-h" hx-swap-oob="true"' in html
    assert "1 interval is unexplained" in html
    last = client.post(url(doubled, "reconciliation-explain", rows[1].pk),
                       {"explanation": "doubled by the 02:00 deploy"}, HTTP_HX_REQUEST="true").content.decode()
    assert "unexplained</span> <strong>0</strong>" in last and "disabled" not in last.split('id="signoff"')[1]
    assert AuditEvent.objects.filter(action="reconciliation.explain", actor_name="olivia").count() == 2

    response = client.post(url(doubled, "reconciliation-signoff"), {"comment": "explained"})
    assert response.status_code == 302 and response["Location"] == url(doubled)
    doubled.refresh_from_db()
    assert doubled.status == "completed"
    page = client.get(url(doubled)).content.decode()
    assert "Signed off: request" in page and "signed off</span> by olivia" in page
    assert "Save explanation" not in page  # final: nothing to edit


def test_an_empty_explanation_is_a_400_on_the_row(web, doubled):
    web("olivia").get(url(doubled))
    row = ReconciliationRow.objects.filter(request=doubled).first()
    response = web("olivia").post(url(doubled, "reconciliation-explain", row.pk), {"explanation": ""},
                                  HTTP_HX_REQUEST="true")
    assert response.status_code == 400
    html = response.content.decode()
    assert "an empty explanation explains nothing" in html and '<details class="explain" open>' in html
    plain = web("olivia").post(url(doubled, "reconciliation-explain", row.pk), {"explanation": ""})
    assert plain.status_code == 400 and "<html" in plain.content.decode()


def test_signoff_with_unexplained_intervals_is_a_409_naming_them(web, doubled):
    response = web("olivia").post(url(doubled, "reconciliation-signoff"), {})
    assert response.status_code == 409
    assert "2 interval(s) are unexplained: 2022-10-01, 2022-10-02" in response.content.decode()
    doubled.refresh_from_db()
    assert doubled.status == "reconciling"


def test_forged_explanation_and_signoff_are_refused(web, doubled, personas):
    web("olivia").get(url(doubled))
    row = ReconciliationRow.objects.filter(request=doubled).first()
    html = web("sam").get(url(doubled)).content.decode()
    assert "Save explanation" not in html and "Only olivia, the owner of dwd_order_items, signs off." in html
    response = web("sam").post(url(doubled, "reconciliation-explain", row.pk), {"explanation": "fine"},
                               HTTP_HX_REQUEST="true")
    assert response.status_code == 403
    # Without htmx the page says why too: sam is not shown the row's form that would carry it.
    response = web("sam").post(url(doubled, "reconciliation-explain", row.pk), {"explanation": "fine"})
    assert response.status_code == 403 and "explaining needs the requester" in response.content.decode()
    # The requester may explain, but never signs off.
    assert "Sign off: done" not in web("alice").get(url(doubled)).content.decode()
    response = web("alice").post(url(doubled, "reconciliation-signoff"), {})
    assert response.status_code == 403 and "signs off" in response.content.decode()
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(personas["olivia"])
    assert strict.post(url(doubled, "reconciliation-explain", row.pk), {"explanation": "x"}).status_code == 403
    row.refresh_from_db()
    assert row.verdict == "unexplained" and row.explanation == ""
    assert AuditEvent.objects.filter(action="denied.reconciliation.signoff", actor_name="alice").count() == 1


def test_verdict_filter_and_recompute(web, doubled):
    client = web("olivia")
    client.get(url(doubled))
    assert "No interval is matched." in client.get(url(doubled), {"verdict": "matched"}).content.decode()
    response = client.post(url(doubled, "reconciliation-recompute"))
    assert response.status_code == 302
    assert AuditEvent.objects.filter(action="reconciliation.compute", actor_name="olivia").count() == 1
    assert web("audrey").post(url(doubled, "reconciliation-recompute")).status_code == 403


def test_a_verdict_shown_can_be_exported_alone_and_an_unknown_one_shows_every_row(web, doubled):
    client = web("olivia")
    html = client.get(url(doubled), {"verdict": "unexplained"}).content.decode()
    link = f"/api/requests/{doubled.pk}/reconciliation/?format=csv&amp;verdict=unexplained"
    assert f'href="{link}"' in html and "Export CSV: unexplained only" in html
    lines = list(csv.reader(io.StringIO(client.get(link.replace("&amp;", "&")).content.decode())))
    table = lines[1:lines.index([])]
    assert sorted(line[2] for line in table) == ["2022-10-01", "2022-10-02"]  # the two doubled days
    assert {line[lines[0].index("status")] for line in table} == {"unexplained"}
    html = client.get(url(doubled), {"verdict": "<b>bogus"}).content.decode()
    assert "only</a>" not in html and "bogus" not in html  # every row, and no filter said to be on
    assert "2022-10-01" in html and "2022-10-02" in html


def test_one_explanation_for_several_intervals_from_the_page(web, doubled):
    client = web("olivia")
    html = client.get(url(doubled)).content.decode()
    assert html.count('form="explain-many"') == 2 and "Explain several intervals with one reason" in html
    refused = client.post(url(doubled, "reconciliation-explain-many"), {"scope": "picked", "explanation": "x"})
    assert refused.status_code == 400 and "choose the intervals" in refused.content.decode()
    bogus = client.post(url(doubled, "reconciliation-explain-many"),
                        {"scope": "picked", "explanation": "x", "intervals": ["nope|x"]}).content.decode()
    assert f"job &#x27;nope&#x27; is not part of request #{doubled.pk}" in bogus and "has no interval" not in bogus
    unknown = client.post(url(doubled, "reconciliation-explain-many"),
                          {"scope": "picked", "explanation": "x", "intervals": ["dwd_order_items|x"]})
    assert unknown.status_code == 400
    assert f"request #{doubled.pk} has no interval &#x27;x&#x27; of dwd_order_items" in unknown.content.decode()
    empty = client.post(url(doubled, "reconciliation-explain-many"), {"scope": "unexplained", "explanation": " "})
    assert empty.status_code == 400 and "empty explanation explains nothing" in empty.content.decode()
    assert not ReconciliationRow.objects.filter(request=doubled, verdict="explained").exists()
    done = client.post(url(doubled, "reconciliation-explain-many"),
                       {"scope": "unexplained", "explanation": "doubled by the 02:00 deploy"}, follow=True)
    assert "Saved one explanation for 2 intervals." in done.content.decode()
    assert set(ReconciliationRow.objects.filter(request=doubled).values_list("verdict", "explanation")) == {
        ("explained", "doubled by the 02:00 deploy")}
    assert AuditEvent.objects.filter(request_id=doubled.pk, action="reconciliation.explain").count() == 2
    # Nobody outside the reviewers explains anything, several at once or not.
    assert web("audrey").post(url(doubled, "reconciliation-explain-many"),
                              {"scope": "unexplained", "explanation": "x"}).status_code == 403
