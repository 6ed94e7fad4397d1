"""Retention of OpenLineage events: the ones delivered more than
LINEAGE_EVENT_RETENTION_DAYS ago are deleted by the retention task, with an audit row;
an event not yet delivered is never deleted, however old, nor an event of a run still in
flight (its last event decides whether its next start is a START or a RUNNING)."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from backfill_portal.core.models import AuditEvent
from backfill_portal.execution.choices import RunStatus
from backfill_portal.execution.models import LineageEvent, Run
from backfill_portal.execution.transitions import run_transition
from backfill_portal.recovery.retention import lineage_events_purge_expired
from backfill_portal.recovery.tasks import purge_versions
from tests.lineage.test_events import file_and_approve

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def ready(catalog, demo_sources, task_queue, warehouse):
    return task_queue


def days_ago(n: int):
    return timezone.now() - timedelta(days=n)


def events_of(partition_key: str) -> list[LineageEvent]:
    return list(LineageEvent.objects.filter(run__partition_key=partition_key).order_by("id"))


def test_delivered_events_older_than_the_window_are_purged_and_undelivered_ones_never(
        personas, ready, receiver, settings):
    settings.LINEAGE_EVENT_RETENTION_DAYS = 30
    file_and_approve(personas, start="2022-10-01", end="2022-10-02")
    ready.drain()
    receiver.refuse(1000)  # the third run's events are never delivered
    file_and_approve(personas, start="2022-10-03", end="2022-10-03")
    ready.drain()
    assert len(receiver.events) == 4 and LineageEvent.objects.filter(sent_at__isnull=True).count() == 2
    LineageEvent.objects.filter(run__partition_key="2022-10-01").update(sent_at=days_ago(40))
    LineageEvent.objects.filter(run__partition_key="2022-10-02").update(sent_at=days_ago(10))
    LineageEvent.objects.filter(run__partition_key="2022-10-03").update(created_at=days_ago(400))
    gone = [e.pk for e in events_of("2022-10-01")]

    counts = purge_versions.apply().get()  # the beat's retention task

    assert counts["lineage_events_purged"] == 2
    assert events_of("2022-10-01") == [] and len(events_of("2022-10-02")) == 2
    assert all(e.sent_at is None for e in events_of("2022-10-03")) and len(events_of("2022-10-03")) == 2
    event = AuditEvent.objects.get(action="lineage_event.purge")
    assert event.data["events"] == 2 and (event.data["first_id"], event.data["last_id"]) == (min(gone), max(gone))
    assert event.actor is None and "30-day retention window" in event.reason
    assert purge_versions.apply().get()["lineage_events_purged"] == 0  # twice: nothing more, no audit row
    assert AuditEvent.objects.filter(action="lineage_event.purge").count() == 1

    # A shorter window takes the ten-day-old ones too; the undelivered still stay.
    assert lineage_events_purge_expired(days=5)["purged"] == 2
    assert LineageEvent.objects.count() == 2 and not LineageEvent.objects.filter(sent_at__isnull=False).exists()


def test_the_events_of_a_run_still_in_flight_are_kept(personas, ready, receiver):
    file_and_approve(personas, start="2022-10-01", end="2022-10-01")
    ready.drain(limit=1)  # dispatch: the run is queued
    run = Run.objects.get()
    run_transition(run, to=RunStatus.RUNNING, reason="a worker took it")
    LineageEvent.objects.filter(run=run).update(sent_at=days_ago(400))

    assert lineage_events_purge_expired()["purged"] == 0
    assert [e.event_type for e in LineageEvent.objects.filter(run=run)] == ["START"]


def test_the_window_comes_from_the_environment(monkeypatch):
    import importlib

    from django.core.exceptions import ImproperlyConfigured

    import backfill_portal.settings as portal_settings

    monkeypatch.setenv("LINEAGE_EVENT_RETENTION_DAYS", "7")
    assert importlib.reload(portal_settings).LINEAGE_EVENT_RETENTION_DAYS == 7
    monkeypatch.setenv("LINEAGE_EVENT_RETENTION_DAYS", "0")
    with pytest.raises(ImproperlyConfigured, match="LINEAGE_EVENT_RETENTION_DAYS=0 must be at least 1"):
        importlib.reload(portal_settings)
    monkeypatch.delenv("LINEAGE_EVENT_RETENTION_DAYS")
    assert importlib.reload(portal_settings).LINEAGE_EVENT_RETENTION_DAYS == 30
