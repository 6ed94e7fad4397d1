"""The audit page's CSV export: every event as stored, its signature's fields, and a
clear refusal of a filter it cannot apply."""
from __future__ import annotations

import csv
import io

import pytest
from django.db import connection
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
