"""The audit page's CSV export: every event as stored, its signature's fields, and a
clear refusal of a filter it cannot apply."""
from __future__ import annotations

import csv
import io

import pytest
from django.core.signals import request_finished
from django.db import close_old_connections, connection
from django.test import Client
from django.urls import reverse

from backfill_portal.core.models import AuditEvent
from tests.core.test_audit import activity, history, tamper  # noqa: F401 (fixtures)


@pytest.fixture
def audrey_client(personas) -> Client:
    client = Client()
    client.force_login(personas["audrey"])
    return client


def exported(response) -> list[dict]:
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    return list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))


@pytest.mark.skipif(connection.vendor != "sqlite", reason="PostgreSQL's timestamp column refuses a value that is not a time")
@pytest.mark.parametrize("stored", ["garbage", "2026-13-45 10:00:00"])
def test_audit_csv_exports_an_event_whose_timestamp_is_not_a_time_as_stored(history, audrey_client, stored):
    """It stopped before that row (and the rows fetched with it) with a 200."""
    target = history[12]
    tamper("UPDATE core_auditevent SET at=%s WHERE id=%s", [stored, target])
    rows = exported(audrey_client.get(reverse("audit"), {"format": "csv"}))
    assert [int(r["id"]) for r in rows] == history[::-1]
    by_id = {int(r["id"]): r for r in rows}
    assert by_id[target]["at"] == stored and by_id[target]["action"]
    assert by_id[target - 1]["at"] == AuditEvent.objects.get(pk=target - 1).at.isoformat()


@pytest.mark.skipif(connection.vendor != "sqlite", reason="PostgreSQL's timestamp column refuses a value that is not a time")
@pytest.mark.parametrize("stored", ["garbage", "2026-13-45 10:00:00"])
def test_the_audit_page_and_api_show_an_event_whose_timestamp_is_not_a_time_flagged(history, audrey_client, stored):
    """'2026-13-45 10:00:00' made the audit page and /api/audit/ a 500 (the driver raised
    reading the page's rows); the row is shown, its time as stored, flagged."""
    target = history[12]
    tamper("UPDATE core_auditevent SET at=%s WHERE id=%s", [stored, target])
    page = audrey_client.get(reverse("audit"), {"before": target + 1})  # the page it is on
    assert page.status_code == 200
    assert f'title="not a time: run manage.py verify_audit">{stored!r}</span>'.replace("'", "&#x27;") in \
        page.content.decode()
    listed = audrey_client.get("/api/audit/", {"page_size": 500})
    assert listed.status_code == 200
    events = {e["id"]: e for e in listed.json()["results"]}
    assert set(events) == set(history) and events[target]["at"] is None and events[target]["action"]
    one = audrey_client.get(f"/api/audit/{target}/")
    assert one.status_code == 200 and one.json()["at"] is None
    assert audrey_client.get(f"/api/audit/{max(history) + 10}/").status_code == 404


def test_audit_csv_has_the_key_id_each_event_is_signed_with(activity, audrey_client, settings):
    """The signature covers the key id and the API shows it; the CSV left it out."""
    response = audrey_client.get(reverse("audit"), {"format": "csv"})
    rows = exported(response)
    assert list(rows[0])[-1] == "key_id"
    assert {int(r["id"]): r["key_id"] for r in rows} == dict(AuditEvent.objects.values_list("id", "key_id"))
    assert {r["key_id"] for r in rows} == {settings.AUDIT_KEY_ID}


@pytest.mark.parametrize("query", [{"since": "2026-13-45"}, {"until": "last tuesday"}, {"request": "x"}])
def test_audit_csv_with_a_bad_filter_is_a_400_naming_the_field_as_the_page(activity, audrey_client, query):
    """It was a 200 with the header row alone, as if nothing matched."""
    (field,) = query
    for params in ({**query, "format": "csv"}, query):
        response = audrey_client.get(reverse("audit"), params)
        assert response.status_code == 400 and response["Content-Type"].startswith("text/html")
        assert "Content-Disposition" not in response
        html = response.content.decode()
        assert f'id="id_{field}_error"' in html
        assert ("Enter a whole number." if field == "request" else "Enter a valid date/time.") in html


def test_a_second_export_while_one_streams_is_told_to_wait_and_the_slot_comes_back(activity, audrey_client):
    """The scale QA: each export held a database connection for as long as it streamed,
    and five at once took every pooled connection (the pages, the API and /readyz
    answered 503). One streams at a time in a process; the others hear when to retry."""
    first = audrey_client.get(reverse("audit"), {"format": "csv"})  # streaming, not read yet
    assert first.status_code == 200
    second = audrey_client.get(reverse("audit"), {"format": "csv"})
    assert second.status_code == 429 and second["Retry-After"] == "30"
    assert "Another export of the audit log is streaming" in second.content.decode()
    assert audrey_client.get(reverse("audit")).status_code == 200  # the page itself is not held
    exported(first)  # read to its end: the response closes and frees the slot
    assert exported(audrey_client.get(reverse("audit"), {"format": "csv"}))
    abandoned = audrey_client.get(reverse("audit"), {"format": "csv"})
    # The client went away before the first row: the server closes the response. (As
    # Django's test client closes one, keeping the test's database connection open.)
    request_finished.disconnect(close_old_connections)
    try:
        abandoned.close()
    finally:
        request_finished.connect(close_old_connections)
    assert exported(audrey_client.get(reverse("audit"), {"format": "csv"}))
