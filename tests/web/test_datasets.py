"""Dataset and partition pages, and the rollback of one partition from the web:
offered to on-call, admins and the owner only, refused if forged, a conflict shown as
a 409, the impact (consumers of the current version) shown before anything moves."""
from __future__ import annotations

import json

import pytest
from django.test import Client
from django.urls import reverse

from backfill_portal.backfills.models import BackfillRequest
from backfill_portal.core.models import AuditEvent
from backfill_portal.execution.models import Run
from backfill_portal.warehouse.models import Publication
from backfill_portal.recovery.rollback import partition_rollback

pytestmark = pytest.mark.django_db(transaction=True)
DATASET = "/datasets/dwd_order_items/"
PART = "/datasets/dwd_order_items/partitions/2022-10-01/"
CONFIRM = PART + "rollback/"


def runs(request) -> dict[str, Run]:
    return {r.partition_key: r for r in Run.objects.filter(request=request)}


def test_dataset_page_lists_partitions_latest_first_with_their_current_version(web, incident, monkeypatch):
    good, bad, dws = incident
    html = web("alice").get(DATASET).content.decode()
    bad_runs = runs(bad)
    assert html.index('href="/datasets/dwd_order_items/partitions/2022-10-02/"') < html.index(
        'href="/datasets/dwd_order_items/partitions/2022-10-01/"')
    for run in bad_runs.values():
        assert f'href="/runs/{run.run_id}/">{run.run_id}</a>' in html
    assert "warehouse differs" not in html
    assert f'href="/requests/{bad.pk}/">#{bad.pk}</a>' in html
    # keyset pagination on the partition key
    monkeypatch.setattr("backfill_portal.web.pages.datasets.PARTITIONS_PER_PAGE", 1)
    first = web("alice").get(DATASET).content.decode()
    assert "partitions/2022-10-02/" in first and "partitions/2022-10-01/" not in first
    assert 'href="?before=2022-10-02"' in first
    second = web("alice").get(DATASET, {"before": "2022-10-02"}).content.decode()
    assert "partitions/2022-10-01/" in second and "partitions/2022-10-02/" not in second
    assert "Older partitions" not in second


def test_a_source_dataset_says_it_is_not_versioned(web, catalog, warehouse):
    html = web("alice").get("/datasets/ods_order_events/").content.decode()
    assert "A source is read, not versioned" in html
    assert web("alice").get("/datasets/nope/").status_code == 404


def test_partition_page_shows_the_current_version_and_the_history(web, incident):
    good, bad, _ = incident
    good_run, bad_run = runs(good)["2022-10-01"], runs(bad)["2022-10-01"]
    html = web("audrey").get(PART).content.decode()
    current = html.split('id="current-h"')[1].split("</section>")[0]
    assert bad_run.run_id in current and str(bad_run.version.row_count) in current
    assert bad_run.version.fingerprint[:10] in current and f'href="/requests/{bad.pk}/"' in current
    history = html.split('id="history-h"')[1]
    assert history.index(bad_run.run_id) < history.index(good_run.run_id)
    assert history.count('<span class="pill pill-published">publish</span>') == 2
    assert 'Roll back…' not in html  # auditors read, they do not act
    assert web("alice").get("/datasets/dwd_order_items/partitions/1999-01-01/").status_code == 404


def test_rollback_is_offered_to_oncall_admins_and_the_owner_only(web, incident):
    for who, offered in [("oscar", True), ("olivia", True), ("admin", True),
                         ("alice", False), ("sam", False), ("audrey", False)]:
        html = web(who).get(PART).content.decode()
        assert (f'hx-get="{CONFIRM}"' in html) is offered, who
        response = web(who).get(CONFIRM, HTTP_HX_REQUEST="true")
        assert response.status_code == (200 if offered else 403), who
        if not offered:  # htmx gets the refusal alone, not a page inside the panel
            html = response.content.decode()
            assert "<html" not in html and "Not allowed (HTTP 403)." in html


def test_confirmation_shows_the_move_and_the_consumers_of_the_current_version(web, incident):
    good, bad, dws = incident
    response = web("oscar").get(CONFIRM, HTTP_HX_REQUEST="true")
    html = response.content.decode()
    assert "<html" not in html and 'id="rollback-confirm"' in html and "autofocus" in html
    assert runs(bad)["2022-10-01"].run_id in html and runs(good)["2022-10-01"].run_id in html
    assert "1 consumer run read the version being rolled back" in html
    assert runs(dws)["2022-10-01"].run_id in html and "dws_sales_daily / 2022-10-01" in html
    assert 'name="rebuild"' in html and "checked" in html.split('name="rebuild"')[1].split(">")[0]
    assert f'hx-post="{CONFIRM}"' in html and "csrfmiddlewaretoken" in html
    page = web("oscar").get(CONFIRM).content.decode()  # without htmx: a page of its own
    assert "<html" in page and 'id="rollback-confirm"' in page


def test_oncall_rolls_back_with_htmx_and_files_the_rebuild(web, incident, warehouse):
    good, bad, dws = incident
    client = web("oscar")
    response = client.post(CONFIRM, {"reason": "amounts doubled", "rebuild": "on"}, HTTP_HX_REQUEST="true")
    assert response.status_code == 200 and json.loads(response["HX-Location"])["path"] == PART
    assert warehouse.current("dwd_order_items", "2022-10-01") == runs(good)["2022-10-01"].run_id
    assert warehouse.current("dwd_order_items", "2022-10-02") == runs(bad)["2022-10-02"].run_id  # untouched
    pub = Publication.objects.filter(dataset__name="dwd_order_items", partition_key="2022-10-01").first()
    assert (pub.action, pub.actor.username, pub.reason) == ("rollback", "oscar", "amounts doubled")
    assert AuditEvent.objects.filter(action="partition.rollback", actor_name="oscar").count() == 1
    rebuild = BackfillRequest.objects.get(job__name="dws_sales_daily", status="pending_approval")
    page = client.get(PART).content.decode()
    assert "Rolled back dwd_order_items/2022-10-01" in page and f"#{rebuild.pk} (dws_sales_daily" in page
    assert '<span class="pill pill-rolled_back">rolled back</span>' in page
    rolled = page.split('id="rolled-h"')[1].split("</section>")[0]
    assert runs(dws)["2022-10-01"].run_id in rolled and "Rebuild these consumers" in rolled
    assert "already rolled back to the current version" in page  # no second rollback offered
    # The one-click rebuild again files nothing new (idempotent).
    assert client.post(reverse("partition-rebuild-consumers", args=["dwd_order_items", "2022-10-01"])).status_code \
        == 302
    assert BackfillRequest.objects.filter(job__name="dws_sales_daily", status="pending_approval").count() == 1


def test_the_owner_rolls_back_without_rebuilding(web, incident, warehouse):
    good, _, _ = incident
    response = web("olivia").post(CONFIRM, {"reason": "wrong numbers"})
    assert response.status_code == 302 and response["Location"] == PART
    assert warehouse.current("dwd_order_items", "2022-10-01") == runs(good)["2022-10-01"].run_id
    assert not BackfillRequest.objects.filter(job__name="dws_sales_daily", status="pending_approval").exists()


def test_rollback_without_a_reason_is_a_400_on_the_field(web, incident, warehouse):
    _, bad, _ = incident
    response = web("oscar").post(CONFIRM, {"reason": " "}, HTTP_HX_REQUEST="true")
    assert response.status_code == 400
    html = response.content.decode()
    assert "say why you roll back" in html and 'aria-invalid="true"' in html
    assert warehouse.current("dwd_order_items", "2022-10-01") == runs(bad)["2022-10-01"].run_id


def test_a_lost_race_is_a_409_with_a_clear_message(web, incident, personas, warehouse):
    partition_rollback(actor=personas["admin"], dataset="dwd_order_items", partition_key="2022-10-01",
                       reason="admin was faster")
    response = web("oscar").post(CONFIRM, {"reason": "amounts doubled"}, HTTP_HX_REQUEST="true")
    assert response.status_code == 409
    html = response.content.decode()
    assert "Conflict (HTTP 409): nothing was changed." in html and "already rolled back" in html
    assert Publication.objects.filter(action="rollback").count() == 1


def test_a_forged_rollback_is_403_recorded_and_moves_nothing(web, incident, warehouse):
    _, bad, _ = incident
    for who in ("alice", "sam", "audrey"):
        response = web(who).post(CONFIRM, {"reason": "let me"}, HTTP_HX_REQUEST="true")
        assert response.status_code == 403, who
        assert "needs on-call, an admin or the dataset owner" in response.content.decode()
        assert warehouse.current("dwd_order_items", "2022-10-01") == runs(bad)["2022-10-01"].run_id
        assert AuditEvent.objects.filter(action="denied.partition.rollback", actor_name=who).count() == 1
        # The rebuild's refusal is the 403 page too (it was a redirect with a message).
        response = web(who).post(reverse("partition-rebuild-consumers", args=["dwd_order_items", "2022-10-01"]))
        assert response.status_code == 403, (who, response.status_code)
        assert "This refusal is recorded in the audit log" in response.content.decode()
        assert AuditEvent.objects.filter(action="denied.rollback.rebuild", actor_name=who).count() == 1
        assert not BackfillRequest.objects.filter(job__name="dws_sales_daily", status="pending_approval").exists()
    # A partition that does not exist is a 404, not a redirect to a page that is one.
    response = web("oscar").post(reverse("partition-rebuild-consumers", args=["dwd_order_items", "2099-10-05"]))
    assert response.status_code == 404


def test_rollback_post_needs_a_csrf_token(incident, personas, warehouse):
    _, bad, _ = incident
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(personas["oscar"])
    assert strict.post(CONFIRM, {"reason": "x"}).status_code == 403
    assert warehouse.current("dwd_order_items", "2022-10-01") == runs(bad)["2022-10-01"].run_id


def test_home_lists_recent_rollbacks(web, incident, personas):
    partition_rollback(actor=personas["oscar"], dataset="dwd_order_items", partition_key="2022-10-02",
                       reason="amounts doubled")
    html = web("alice").get("/").content.decode()
    recent = html.split('id="rollbacks-h"')[1].split("</section>")[0]
    assert 'href="/datasets/dwd_order_items/partitions/2022-10-02/"' in recent
    assert "oscar" in recent and "amounts doubled" in recent


def test_request_rollback_from_the_detail_page(web, incident, warehouse):
    good, bad, dws = incident
    detail = reverse("request-detail", args=[bad.pk])
    action = reverse("request-rollback", args=[bad.pk])
    assert f'action="{action}"' in web("oscar").get(detail).content.decode()
    assert f'action="{action}"' not in web("alice").get(detail).content.decode()
    forged = web("alice").post(action, {"reason": "mine"})
    assert forged.status_code == 403 and "needs on-call, an admin or the dataset owner" in forged.content.decode()
    client = web("oscar")
    empty = client.post(action, {"reason": ""})
    assert empty.status_code == 400 and "say why you roll back" in empty.content.decode()
    bad.refresh_from_db()
    assert bad.status == "reconciling"
    response = client.post(action, {"reason": "amounts doubled", "rebuild": "on"})
    assert response.status_code == 302 and response["Location"] == detail
    bad.refresh_from_db()
    assert bad.status == "rolled_back"
    for day, run in runs(good).items():
        assert warehouse.current("dwd_order_items", day) == run.run_id
    page = client.get(detail).content.decode()
    assert f"Request #{bad.pk} rolled back: 2 partition(s)" in page and "Filed to rebuild them: #" in page
    assert BackfillRequest.objects.filter(job__name="dws_sales_daily", parent=bad).count() == 1
    assert f'action="{action}"' not in page  # nothing left to roll back


def test_an_unreachable_warehouse_is_a_503_naming_it_on_pages_and_the_api(web, api, incident, settings):
    """The exploratory deploy test: with the warehouse down, the dataset and partition
    pages and their API twins answered 500 'Something went wrong'. A service that is
    down is a 503 naming it, with Retry-After, never a 500."""
    from backfill_portal.backends import reset_warehouse_cache

    settings.WAREHOUSE_URL = "postgresql://postgres@127.0.0.1:1/nowhere"  # nothing listens on port 1
    reset_warehouse_cache()
    try:
        for path in (DATASET, PART):
            response = web("oscar").get(path)
            assert response.status_code == 503, path
            assert response["Retry-After"] == "10"
            html = response.content.decode()
            assert "cannot connect to the warehouse" in html.lower() and "Traceback" not in html
        response = api("oscar").get("/api" + PART)
        assert response.status_code == 503
        body = response.json()
        assert body["code"] == "unavailable" and "cannot connect to the warehouse" in body["detail"]
    finally:
        reset_warehouse_cache()


def test_an_hourly_partition_spelt_another_way_is_found(web, api, personas, catalog, demo_sources, task_queue):
    """The exploratory test: request bounds accept an hour in UTC or with seconds, but the
    partition pages answered 404 'no version' for those spellings of a published hour."""
    from tests.extending.helpers import approved_request

    key = "2022-10-01T06:00-04:00"  # New York, summer time
    approved_request(personas, "page_views_hourly", day=key)
    task_queue.drain()
    assert web("oscar").get(f"/datasets/page_views_hourly/partitions/{key}/").status_code == 200
    for other in ("2022-10-01T10:00Z", "2022-10-01T06:00:00-04:00", "2022-10-01T10:00+00:00"):
        response = web("oscar").get(f"/datasets/page_views_hourly/partitions/{other}/")
        assert response.status_code == 302 and response["Location"] == f"/datasets/page_views_hourly/partitions/{key}/"
        body = api("oscar").get(f"/api/datasets/page_views_hourly/partitions/{other}/")
        assert body.status_code == 200 and body.json()["partition_key"] == key and body.json()["current_run_id"]
    # An hour that is not published, or not an hour at all, is still a 404.
    assert web("oscar").get("/datasets/page_views_hourly/partitions/2022-10-01T11:00Z/").status_code == 404
    assert web("oscar").get("/datasets/page_views_hourly/partitions/2022-10-01T06:30-04:00/").status_code == 404
