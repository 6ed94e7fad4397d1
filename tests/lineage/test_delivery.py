"""Sent after commit through the outbox: a crash neither loses an event nor sends it twice
(beyond an identical resend a receiver deduplicates by run id, event type and time)."""
from __future__ import annotations

import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import transaction
from django.utils import timezone

from backfill_portal.execution.choices import RunStatus
from backfill_portal.execution.lineage_out.events import run_uuid
from backfill_portal.execution.lineage_out.outbox import SEND_TASK, lineage_events_resend, lineage_events_send
from backfill_portal.execution.models import LineageEvent, Run
from backfill_portal.execution.services.sweep import sweep_run
from backfill_portal.execution.transitions import run_transition
from tests.lineage.test_events import file_and_approve

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def ready(catalog, demo_sources, task_queue, warehouse):
    return task_queue


def later(seconds: int = 3600):
    return timezone.now() + timedelta(seconds=seconds)


def told(receiver) -> list[tuple[str, str]]:
    return [(e["run"]["runId"], e["eventType"]) for e in receiver.events]


def test_a_receiver_that_is_down_gets_every_event_once_in_order_when_it_is_back(personas, ready, receiver):
    receiver.refuse(1000)
    file_and_approve(personas, start="2022-10-01", end="2022-10-02")
    ready.drain()
    assert Run.objects.filter(status=RunStatus.PUBLISHED).count() == 2  # lineage never holds the work up
    assert receiver.events == [] and receiver.refused > 0
    unsent = list(LineageEvent.objects.filter(sent_at__isnull=True))
    assert len(unsent) == 4
    # Each START was tried (and waits out a backoff); each COMPLETE waits behind its START,
    # so a receiver gets a run's events in order.
    assert all(e.tries >= 1 and e.next_try_at and "503" in e.last_error for e in unsent if e.event_type == "START")
    assert all(e.tries == 0 for e in unsent if e.event_type == "COMPLETE")
    assert lineage_events_resend() == 0  # not due yet: each waits out its backoff

    receiver.refuse(0)
    counts = sweep_run(now=later())
    assert counts["lineage"] == 2  # one send task per run
    ready.drain()
    runs = list(Run.objects.order_by("id"))
    assert told(receiver) == [(run_uuid(r.run_id), t) for r in runs for t in ("START", "COMPLETE")]
    assert not LineageEvent.objects.filter(sent_at__isnull=True).exists()
    assert sweep_run(now=later())["lineage"] == 0
    ready.drain()
    assert len(receiver.events) == 4


def test_sends_lost_after_commit_are_sent_by_the_sweeper_and_a_second_delivery_sends_nothing(
        personas, ready, receiver):
    file_and_approve(personas, start="2022-10-01", end="2022-10-01")
    # The process dies after each commit, before sending: the broker never gets the sends.
    ready.drain(skip=lambda task, args: task == SEND_TASK)
    lost = [args for task, args, *_ in ready.sent if task == SEND_TASK]
    ready.sent.clear()
    assert len(lost) == 2 and receiver.events == []
    assert lineage_events_resend() == 0  # younger than the grace: a send may still be under way
    assert lineage_events_resend(now=later(120)) == 1
    ready.drain()
    run = Run.objects.get()
    assert told(receiver) == [(run_uuid(run.run_id), "START"), (run_uuid(run.run_id), "COMPLETE")]
    # The lost messages turn up after all (a broker that kept them): nothing goes twice.
    for args in lost:
        assert lineage_events_send(event_id=args[0]) == "already-sent"
    assert len(receiver.events) == 2


def test_a_sender_that_died_holding_the_lease_is_finished_by_the_sweeper_with_the_same_bytes(
        personas, ready, receiver):
    file_and_approve(personas, start="2022-10-01", end="2022-10-01")
    ready.drain(skip=lambda task, args: task == SEND_TASK)
    ready.sent.clear()
    first, last = LineageEvent.objects.order_by("id")
    # A sender took the START's lease and died: nobody else sends it while the lease
    # lasts, and the run's later events wait behind it.
    LineageEvent.objects.filter(pk=first.pk).update(claimed_until=later(300))
    assert lineage_events_send(event_id=first.pk) == "claimed-elsewhere"
    assert lineage_events_send(event_id=last.pk) == "claimed-elsewhere"
    assert receiver.events == []
    # ... and once it has expired, the sweeper sends it, as it was written.
    LineageEvent.objects.filter(pk=first.pk).update(claimed_until=timezone.now() - timedelta(seconds=1))
    assert lineage_events_resend(now=later(120)) == 1
    ready.drain()
    assert [e for e in receiver.events if e["eventType"] == "START"] == [first.payload]
    assert len(receiver.events) == 2


def test_a_transition_that_rolls_back_leaves_no_event(personas, ready, receiver):
    file_and_approve(personas, start="2022-10-01", end="2022-10-01")
    ready.drain(limit=1)  # dispatch: the run is queued
    run = Run.objects.get()

    class Crash(Exception):
        pass

    with pytest.raises(Crash), transaction.atomic():
        run_transition(run, to=RunStatus.CANCELLED, reason="changed my mind")
        assert LineageEvent.objects.filter(run=run, event_type="ABORT").exists()
        raise Crash
    assert not LineageEvent.objects.filter(run=run).exists()
    ready.drain()
    assert [e["eventType"] for e in receiver.events] == ["START", "COMPLETE"]


def test_the_validator_refuses_what_the_spec_refuses(personas, ready, receiver, openlineage_spec):
    file_and_approve(personas, start="2022-10-01", end="2022-10-01")
    ready.drain()
    good = receiver.events[-1]
    openlineage_spec.validate(good)
    import copy

    no_run_id = copy.deepcopy(good)
    no_run_id["run"].pop("runId")
    bad_assertion = copy.deepcopy(good)
    bad_assertion["outputs"][0]["facets"]["dataQualityAssertions"]["assertions"][0]["success"] = "yes"
    bad_own_facet = copy.deepcopy(good)
    bad_own_facet["outputs"][0]["outputFacets"]["backfillPortal_publication"]["action"] = "overwrite"
    unknown_schema = copy.deepcopy(good)
    unknown_schema["run"]["facets"]["nominalTime"]["_schemaURL"] = "https://example.org/Nope.json#/$defs/Nope"
    for broken in (no_run_id, bad_assertion, bad_own_facet, unknown_schema):
        with pytest.raises(Exception):
            openlineage_spec.validate(broken)


@pytest.mark.parametrize("env, message", [
    ({"OPENLINEAGE_URL": "ftp://lineage.example"}, "must be an http:// or https:// URL"),
    ({"OPENLINEAGE_URL": "http://127.0.0.1:5000", "OPENLINEAGE_FILE": "/tmp/x.jsonl"}, "not both"),
    ({"OPENLINEAGE_TIMEOUT_SECONDS": "soon"}, "is not a number"),
    # One message for every value under the floor (-1 said "zero or more", then 0 was refused):
    ({"OPENLINEAGE_TIMEOUT_SECONDS": "-1"}, "must be at least 0.001"),
    ({"OPENLINEAGE_TIMEOUT_SECONDS": "0"}, "must be at least 0.001"),
])
def test_bad_lineage_settings_are_refused_in_one_line(env, message):
    import os

    result = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, capture_output=True, text=True,
                            env={**os.environ, **env}, timeout=120)
    assert result.returncode == 1
    assert message in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
