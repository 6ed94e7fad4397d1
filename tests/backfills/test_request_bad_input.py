"""Bad input to the request API: 400 naming the field, and nothing written."""
from __future__ import annotations

import pytest

from backfill_portal.backfills.choices import RequestStatus
from backfill_portal.backfills.models import BackfillRequest, Interval
from backfill_portal.backfills.services.requests import backfill_request_create
from backfill_portal.backfills.transitions import request_transition
from backfill_portal.core.models import AuditEvent

VALID = {"job": "dwd_order_items", "start": "2022-10-01", "end": "2022-10-03",
         "reason": "late order events from the payment gateway"}


def counts() -> tuple[int, int, int]:
    return BackfillRequest.objects.count(), Interval.objects.count(), AuditEvent.objects.count()


def assert_refused(client, field: str, *, status: int = 400, **overrides) -> dict:
    before = counts()
    response = client.post("/api/requests/", {**VALID, **overrides}, format="json")
    assert response.status_code == status, response.content
    body = response.json()
    assert field in body["errors"], body
    assert body["detail"]
    assert counts() == before
    return body


def test_end_before_start_is_refused(api, catalog):
    assert_refused(api("alice"), "end", start="2022-10-10", end="2022-10-01")


def test_unknown_job_is_refused(api, catalog):
    assert_refused(api("alice"), "job", job="no_such_job")


def test_source_dataset_cannot_be_backfilled(api, catalog):
    # ods_order_events is a source: nothing produces it, so there is no job of that name.
    assert_refused(api("alice"), "job", job="ods_order_events")


@pytest.mark.parametrize("start", ["yesterday", "2022-13-45", "20221001", "2022-10"])
def test_unparseable_date_is_refused(api, catalog, start):
    assert_refused(api("alice"), "start", start=start)


def test_timezone_naive_datetime_for_hourly_job_is_refused(api, catalog):
    body = assert_refused(api("alice"), "start", job="page_views_hourly",
                          start="2022-11-06T01:00", end="2022-11-06T03:00-05:00")
    assert "offset" in body["errors"]["start"][0]


def test_range_over_the_limit_is_refused(api, catalog, settings):
    settings.BACKFILL_MAX_INTERVALS = 10
    body = assert_refused(api("alice"), "end", start="2022-10-01", end="2022-10-31")
    assert "31" in body["errors"]["end"][0] and "10" in body["errors"]["end"][0]
    # Exactly at the limit is fine.
    response = api("alice").post("/api/requests/", {**VALID, "end": "2022-10-10"}, format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["interval_count"] == 10


def test_unknown_cascade_is_refused(api, catalog):
    assert_refused(api("alice"), "cascade", cascade="sideways")


def test_unknown_strategy_is_refused(api, catalog):
    assert_refused(api("alice"), "strategy", strategy="random")


@pytest.mark.parametrize("reason", ["", "    "])
def test_empty_reason_is_refused(api, catalog, reason):
    assert_refused(api("alice"), "reason", reason=reason)


@pytest.mark.parametrize("value", [0, -1, 65, "many"])
def test_max_active_intervals_out_of_range_is_refused(api, catalog, value):
    assert_refused(api("alice"), "max_active_intervals", max_active_intervals=value)


def test_side_effects_naming_a_non_side_effect_job_is_refused(api, catalog):
    body = assert_refused(api("alice"), "side_effects", side_effects=["dws_sales_daily"])
    assert "side-effect" in body["errors"]["side_effects"][0]


def test_a_side_effect_node_as_the_target_must_be_authorised(api, catalog):
    """Planned unauthorised, every interval of it would be skipped after the approvals."""
    body = assert_refused(api("alice"), "side_effects", job="notify_finance")
    assert "notify_finance is a side-effect node" in body["errors"]["side_effects"][0]
    response = api("alice").post("/api/requests/", {**VALID, "job": "notify_finance",
                                                    "side_effects": ["notify_finance"]}, format="json")
    assert response.status_code == 201, response.content
    assert not Interval.objects.filter(request_id=response.json()["id"], note__startswith="skipped").exists()


def test_side_effects_naming_an_unknown_job_is_refused(api, catalog):
    assert_refused(api("alice"), "side_effects", side_effects=["ghost"])


def test_every_bad_field_is_named_at_once(api, catalog):
    body = assert_refused(api("alice"), "job", job="no_such_job", reason="", side_effects=["ghost"])
    assert {"job", "reason", "side_effects"} <= set(body["errors"])


def test_service_refuses_bad_input_without_writing(alice, catalog):
    from backfill_portal.core.errors import ValidationError

    before = counts()
    with pytest.raises(ValidationError) as exc:
        backfill_request_create(actor=alice, job="dwd_order_items", start="2022-10-01", end="2022-10-03",
                                reason="x", max_active_intervals=0, cascade="sideways")
    assert {"max_active_intervals", "cascade"} <= set(exc.value.fields)
    assert counts() == before


def test_malformed_json_body_is_400_not_500(api, catalog):
    before = counts()
    response = api("alice").post("/api/requests/", data='{"job": "dwd_order_items", ', content_type="application/json")
    assert response.status_code == 400, response.content
    assert response.json()["detail"]
    assert counts() == before


def test_missing_fields_are_named(api, catalog):
    before = counts()
    response = api("alice").post("/api/requests/", {}, format="json")
    assert response.status_code == 400
    assert {"job", "start", "end", "reason"} <= set(response.json()["errors"])
    assert counts() == before


def test_get_missing_request_is_404_json(api, catalog):
    response = api("alice").get("/api/requests/999999/")
    assert response.status_code == 404
    assert response["Content-Type"].startswith("application/json")
    assert response.json()["detail"]


@pytest.mark.parametrize("verb", ["submit", "cancel", "approve", "reject"])
def test_action_on_missing_request_is_404_json(api, catalog, verb):
    before = counts()
    response = api("admin").post(f"/api/requests/999999/{verb}/", {"comment": "x"}, format="json")
    assert response.status_code == 404, response.content
    assert response.json()["code"] == "not_found"
    assert counts() == before


def test_cancelling_a_completed_request_is_a_conflict(api, alice, catalog):
    request, _ = backfill_request_create(actor=alice, job="dwd_order_items", start="2022-10-01",
                                         end="2022-10-02", reason="walk the edges")
    for to in (RequestStatus.PENDING_APPROVAL, RequestStatus.APPROVED, RequestStatus.RUNNING,
               RequestStatus.RECONCILING, RequestStatus.COMPLETED):
        request_transition(request, to=to, actor=None)
    assert BackfillRequest.objects.get(pk=request.pk).status == RequestStatus.COMPLETED

    before = counts()
    response = api("alice").post(f"/api/requests/{request.pk}/cancel/", {"reason": "too late"}, format="json")
    assert response.status_code == 409, response.json()
    assert "status" in response.json()["errors"]
    assert BackfillRequest.objects.get(pk=request.pk).status == RequestStatus.COMPLETED
    assert counts() == before


def test_a_depends_on_past_job_refuses_an_order_it_cannot_run_in(api, personas):
    """The exploratory test: `backward` was accepted for a running total, shown on the
    request page, and the partitions ran oldest first anyway."""
    from backfill_portal.catalog.services.sync import catalog_sync
    from tests.reconciliation.helpers import catalog_text

    catalog_sync(text=catalog_text(deep=True))
    for strategy in ("backward", "parallel"):
        response = api("alice").post("/api/requests/", {"job": "gmv_to_date", "start": "2022-10-01",
                                                        "end": "2022-10-02", "reason": "r", "strategy": strategy},
                                     format="json")
        assert response.status_code == 400
        assert response.json()["errors"]["strategy"] == [
            "gmv_to_date depends on its past: its partitions run oldest first, so the strategy is forward"]
