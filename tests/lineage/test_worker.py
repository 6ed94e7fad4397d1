"""A real Celery worker (and its embedded scheduler) sends the events to the test's HTTP
receiver from another process: the receiver refuses the first sends, the sweeper sends
them again, and each event arrives exactly once, in order. Skipped (with the reason)
unless CI's second pass provides PostgreSQL and Redis."""
from __future__ import annotations

import time

import pytest

from backfill_portal.execution.choices import RunStatus
from backfill_portal.execution.lineage_out.events import run_uuid
from backfill_portal.execution.models import LineageEvent, Run
from tests.execution.test_pipeline import approved_request
from tests.workers import BROKER

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.worker,
    pytest.mark.skipif(not BROKER.startswith("redis"), reason="needs CELERY_BROKER_URL=redis://... (CI's second pass)"),
]


def test_a_real_worker_delivers_each_event_once_though_the_receiver_refused_the_first(
        personas, receiver, start_worker):
    receiver.refuse(1)  # the START's first send: 503
    start_worker(name="lineage", beat="embedded", settle=0, OPENLINEAGE_URL=receiver.url, SWEEP_SECONDS=1,
                 SWEEP_GRACE_SECONDS=2)
    request = approved_request(personas, job="slow_items", start="2022-10-01", end="2022-10-01")
    deadline = time.time() + 120
    while time.time() < deadline:
        run = Run.objects.filter(request=request).first()
        if run is not None and run.status == RunStatus.PUBLISHED and len(receiver.events) >= 2:
            break
        time.sleep(0.5)
    run = Run.objects.get(request=request)
    assert run.status == RunStatus.PUBLISHED, run.error
    assert receiver.refused == 1
    time.sleep(3)  # a few more sweeps: nothing is sent again
    assert [(e["run"]["runId"], e["eventType"]) for e in receiver.events] == [
        (run_uuid(run.run_id), "START"), (run_uuid(run.run_id), "COMPLETE")]
    assert list(LineageEvent.objects.filter(run=run).values_list("event_type", "tries")) == [
        ("START", 2), ("COMPLETE", 1)]
    assert [e["eventTime"] for e in receiver.events] == [
        e.payload["eventTime"] for e in LineageEvent.objects.filter(run=run).order_by("id")]
