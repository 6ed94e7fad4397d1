"""A backfill covers only intervals that have ended, as the scheduler runs an interval
only after its end: a request for today (or later) would publish a partial partition
that readers take for the whole. Creation and the API preview refuse it with a 400 on
`end` naming the first interval still open and when it ends (UTC); a cascade that
would rebuild a downstream partition still open is refused too. The form's preview:
tests/web/test_request_new.py."""
from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.utils import timezone

from backfill_portal.backfills.models import BackfillRequest, Interval
from backfill_portal.catalog.calendar import partition_for
from backfill_portal.core.models import AuditEvent

REASON = "late order events from the payment gateway"


def counts() -> tuple[int, int, int]:
    return BackfillRequest.objects.count(), Interval.objects.count(), AuditEvent.objects.count()


def file(client, **body):
    return client.post("/api/requests/", {"job": "dwd_order_items", "reason": REASON, **body}, format="json")


@pytest.fixture
def clock(monkeypatch):
    """clock(datetime) -> timezone.now() answers that instant from then on."""

    def set_now(at: datetime) -> None:
        monkeypatch.setattr(timezone, "now", lambda: at)

    return set_now


def test_a_request_from_today_to_tomorrow_is_refused_naming_today_and_when_it_ends(api, catalog):
    today = partition_for(grain="day", timezone="Asia/Shanghai", at=timezone.now())
    tomorrow = partition_for(grain="day", timezone="Asia/Shanghai", at=today.end)
    before = counts()
    response = file(api("alice"), start=today.partition_key, end=tomorrow.partition_key)
    assert response.status_code == 400, response.json()
    [message] = response.json()["errors"]["end"]
    assert message == (f"partition {today.partition_key} of dwd_order_items has not ended yet: it ends at "
                       f"{today.end:%Y-%m-%d %H:%M} UTC; backfill only intervals that have ended, or readers "
                       "would see a partial day")
    assert counts() == before


def test_a_request_in_the_future_is_refused_naming_its_first_partition(api, catalog):
    response = file(api("alice"), start="2099-01-01", end="2099-01-03")
    assert response.status_code == 400
    # Shanghai's 2099-01-01 ends at local midnight, 16:00 UTC.
    assert "partition 2099-01-01 of dwd_order_items has not ended yet: it ends at 2099-01-01 16:00 UTC" in \
        response.json()["errors"]["end"][0]


def test_the_last_partition_is_accepted_from_the_instant_it_ends(api, catalog, clock):
    # 2022-10-15 in Shanghai is [2022-10-14 16:00, 2022-10-15 16:00) UTC.
    clock(datetime(2022, 10, 15, 15, 59, 59, tzinfo=UTC))
    refused = file(api("alice"), start="2022-10-13", end="2022-10-15")
    assert refused.status_code == 400
    assert "partition 2022-10-15 of dwd_order_items has not ended yet: it ends at 2022-10-15 16:00 UTC" in \
        refused.json()["errors"]["end"][0]
    clock(datetime(2022, 10, 15, 16, 0, tzinfo=UTC))
    accepted = file(api("alice"), start="2022-10-13", end="2022-10-15")
    assert accepted.status_code == 201, accepted.json()
    assert accepted.json()["interval_count"] == 3


def test_an_hourly_request_is_refused_from_the_hour_still_running(api, catalog, clock):
    clock(datetime(2022, 11, 6, 6, 30, tzinfo=UTC))  # 01:30 EST, the repeated hour's second occurrence
    response = file(api("alice"), job="page_views_hourly", start="2022-11-06T00:00-04:00",
                    end="2022-11-06T03:00-05:00")
    assert response.status_code == 400
    assert ("partition 2022-11-06T01:00-05:00 of page_views_hourly has not ended yet: it ends at "
            "2022-11-06 07:00 UTC") in response.json()["errors"]["end"][0]


def test_a_cascade_that_would_rebuild_an_open_downstream_month_is_refused_unless_that_node_is_skipped(
        api, catalog, clock):
    # The days have ended; monthly_summary's October (Europe/London), built from them, has not.
    clock(datetime(2022, 10, 20, tzinfo=UTC))
    before = counts()
    response = file(api("alice"), start="2022-10-01", end="2022-10-03", cascade="cascade")
    assert response.status_code == 400, response.json()
    assert response.json()["errors"]["end"] == [
        "the cascade rebuilds partition 2022-10 of monthly_summary, which has not ended yet: it ends at "
        "2022-11-01 00:00 UTC; end the range earlier, or skip monthly_summary"]
    assert counts() == before
    skipped = file(api("alice"), start="2022-10-01", end="2022-10-03", cascade="cascade",
                   node_actions={"monthly_summary": "skip"})
    assert skipped.status_code == 201, skipped.json()


def test_the_api_preview_refuses_an_open_range_like_creation(api, catalog):
    response = api("alice").post("/api/requests/preview/", {"job": "dwd_order_items", "start": "2099-01-01",
                                                             "end": "2099-01-01"}, format="json")
    assert response.status_code == 400, response.json()
    assert "has not ended yet: it ends at 2099-01-01 16:00 UTC" in response.json()["errors"]["end"][0]


def test_the_api_preview_refuses_a_cascade_into_an_open_downstream_partition(api, catalog, clock):
    clock(datetime(2022, 10, 20, tzinfo=UTC))
    response = api("alice").post("/api/requests/preview/", {"job": "dwd_order_items", "start": "2022-10-01",
                                                             "end": "2022-10-03", "cascade": "cascade"},
                                 format="json")
    assert response.status_code == 400, response.json()
    assert "the cascade rebuilds partition 2022-10 of monthly_summary" in response.json()["errors"]["end"][0]

