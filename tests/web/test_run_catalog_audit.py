"""Run detail (from a real pipeline run), the catalog with code-version diffs, and the audit log."""
from __future__ import annotations

import csv
import io

import pytest
from django.urls import reverse

from backfill_portal.catalog.services.sync import catalog_sync
from backfill_portal.core.models import AuditEvent
from backfill_portal.core.services.audit import audit_record
from backfill_portal.execution.choices import RunStatus
from backfill_portal.execution.models import Run
from tests.conftest import TEST_CATALOG
from tests.web.conftest import REASON


@pytest.mark.django_db(transaction=True)
def test_run_detail_shows_identity_attempts_checks_inputs_version_and_publications(
        web, make_request, demo_sources, task_queue, warehouse):
    make_request("approved", start="2022-10-01", end="2022-10-01")  # approval starts it after commit
    task_queue.drain()
    first = Run.objects.get(status=RunStatus.PUBLISHED)
    make_request("approved", start="2022-10-01", end="2022-10-01")
    task_queue.drain()
    run = Run.objects.exclude(pk=first.pk).get()
    assert run.status == RunStatus.PUBLISHED
    html = web("audrey").get(reverse("run-detail", args=[run.run_id])).content.decode()
    assert run.run_id in html and "dwd_order_items" in html and "2022-10-01" in html
    assert "2022-09-30T16:00Z" in html and "2022-10-01T16:00Z" in html  # the Shanghai day in UTC
    assert run.code_version.hash[:12] in html and ">backfill<" in html
    assert "pill-succeeded" in html  # the attempt
    assert "unique_business_key" in html and "<dt>duplicate_keys</dt>" in html
    assert "ods_order_events" in html and "source watermark" in html  # pinned input
    assert str(run.version.row_count) in html
    assert '<span class="pill pill-published">current</span>' in html
    publications = html.split('id="version-h"')[1]
    assert ">publish<" in publications and first.run_id in publications  # replaced the first version
    old = web("audrey").get(reverse("run-detail", args=[first.run_id])).content.decode()
    assert "<dt>Current</dt><dd>no" in old


def test_catalog_lists_jobs_and_datasets_with_owner_grain_timezone_key_and_code_version(web, catalog):
    from backfill_portal.catalog.models import Job

    html = web("alice").get(reverse("catalog")).content.decode()
    job = Job.objects.select_related("current_code_version").get(name="dwd_order_items")
    assert job.current_code_version.hash[:12] in html
    for text in ("ods_order_events", "source", "olivia", "core-data", "Asia/Shanghai", "America/New_York",
                 "order_id, item_id", "side effect", 'href="/catalog/jobs/page_views_hourly/"'):
        assert text in html, text


def test_job_page_shows_code_versions_newest_first_with_a_unified_diff(web, catalog):
    catalog_sync(text=TEST_CATALOG.replace(") AS latest WHERE rn = 1", ") AS latest WHERE rn = 1 AND amount > 0"))
    from backfill_portal.catalog.models import CodeVersion

    old, new = CodeVersion.objects.filter(job__name="dwd_order_items").order_by("id")
    html = web("alice").get(reverse("catalog-job", args=["dwd_order_items"])).content.decode()
    assert html.index(new.hash[:12]) < html.index(f">{old.hash[:12]}<")
    assert f'<span class="d-meta">--- {old.hash[:12]}</span>' in html
    assert f'<span class="d-meta">+++ {new.hash[:12]}</span>' in html
    assert '<span class="d-del">-) AS latest WHERE rn = 1</span>' in html
    assert '<span class="d-add">+) AS latest WHERE rn = 1 AND amount &gt; 0</span>' in html
    assert "First version: full definition" in html
    assert 'href="/requests/new/?job=dwd_order_items"' in html


# --- audit --------------------------------------------------------------------------------


def test_audit_lists_events_newest_first_with_filters(web, make_request):
    a = make_request("pending", start="2022-10-01", end="2022-10-02")
    b = make_request("pending", start="2022-11-01", end="2022-11-02", requester="sam")
    client = web("audrey")
    html = client.get(reverse("audit")).content.decode()
    ids = [int(chunk.split("<")[0]) for chunk in html.split('<td class="num">')[1:]]
    newest = list(AuditEvent.objects.order_by("-id").values_list("id", flat=True)[:50])  # one page
    assert ids == newest
    html = client.get(reverse("audit"), {"request": a.pk}).content.decode()
    assert f'href="/requests/{a.pk}/"' in html and f'href="/requests/{b.pk}/"' not in html
    html = client.get(reverse("audit"), {"actor": "sam", "action": "request."}).content.decode()
    assert "request.create" in html and "request.submit" in html and f"#{a.pk}<" not in html
    html = client.get(reverse("audit"), {"dataset": "no_such"}).content.decode()
    assert "No event matches these filters." in html
    html = client.get(reverse("audit"), {"since": "2999-01-01T00:00"}).content.decode()
    assert "No event matches these filters." in html
    html = client.get(reverse("audit"), {"until": "2999-01-01"}).content.decode()
    assert "No event matches" not in html
    html = client.get(reverse("audit"), {"request": "x"}).content.decode()
    assert 'id="id_request_error"' in html


def test_audit_keyset_pagination_walks_every_event_once(web, personas, catalog):
    for i in range(120):
        audit_record(actor=personas["alice"], action="test.event", object_type="test", object_id=i)
    client = web("audrey")
    seen, url = [], reverse("audit") + "?action=test."
    while url:
        html = client.get(url).content.decode()
        page = [int(chunk.split("<")[0]) for chunk in html.split('<td class="num">')[1:]]
        assert len(page) <= 50
        seen += page
        url = None
        if 'rel="next"' in html:
            href = html.split('rel="next"')[0].rsplit('href="', 1)[1].split('"')[0]
            assert "action=test." in href  # filters survive paging
            url = reverse("audit") + href.replace("&amp;", "&")
    assert len(seen) == 120 and len(set(seen)) == 120 and seen == sorted(seen, reverse=True)


def test_audit_csv_exports_the_filtered_set_and_neutralises_formulas(web, make_request, personas):
    req = make_request("pending")
    audit_record(actor=personas["alice"], action="test.note", object_type="request", object_id=req.pk,
                 request_id=req.pk, reason="=HYPERLINK(\"http://evil\")")
    response = web("audrey").get(reverse("audit"), {"request": req.pk, "format": "csv"})
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    assert "attachment;" in response["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    expected = AuditEvent.objects.filter(request_id=req.pk).count()
    assert len(rows) == expected and {r["request_id"] for r in rows} == {str(req.pk)}
    assert [int(r["id"]) for r in rows] == sorted((int(r["id"]) for r in rows), reverse=True)
    assert rows[0]["reason"].startswith("'=HYPERLINK")
    assert any(r["reason"] == REASON for r in rows)
    assert all(len(r["hash"]) == 64 for r in rows)


@pytest.mark.parametrize("reason", ["+1+cmd|' /C calc'!A0", "-2+3+cmd|' /C calc'!A0", "@SUM(1+1)",
                                    "\t=1+1", "\r=1+1"])
def test_audit_csv_writes_every_formula_start_as_text(web, make_request, personas, reason):
    req = make_request("draft")
    audit_record(actor=personas["alice"], action="test.note", object_type="request", object_id=req.pk,
                 request_id=req.pk, reason=reason)
    response = web("audrey").get(reverse("audit"), {"request": req.pk, "action": "test.", "format": "csv"})
    (row,) = csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode()))
    assert row["reason"] == "'" + reason
    assert row["request_id"] == str(req.pk)
