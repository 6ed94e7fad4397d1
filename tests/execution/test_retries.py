"""Backoff between attempts: a failed attempt waits base * 2^(n-1) seconds, with jitter,
before the next one, so a poison run does not spend its attempts in one second and runs
that failed together do not retry together. The broker holds the retry to its time
(the message's eta); a copy delivered early (a re-send) is sent back to wait."""
from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from backfill_portal.backfills.choices import RequestStatus
from backfill_portal.core.models import AuditEvent
from backfill_portal.execution.choices import AttemptStatus, RunStatus
from backfill_portal.execution.models import Run
from backfill_portal.execution.services.runs import retry_delay, run_execute
from tests.execution import jobs as test_jobs
from tests.execution.test_pipeline import approved_request

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def ready(catalog, demo_sources, task_queue, warehouse):
    yield task_queue
    test_jobs.CRASH.update(after_fraction=None, times=0, let_through=0)


def in_backoff(task, args) -> bool:
    """What a broker would still hold: an execute message whose run waits for its retry time."""
    return task == "execution.execute_run" and Run.objects.filter(run_id=args[0], retry_at__gt=timezone.now()).exists()


def test_the_delay_doubles_with_each_failure_up_to_the_cap_and_is_jittered(settings):
    settings.RETRY_BACKOFF_SECONDS = 2
    settings.RETRY_BACKOFF_MAX_SECONDS = 10
    for failures, ceiling in [(1, 2), (2, 4), (3, 8), (4, 10), (40, 10)]:
        delays = [retry_delay(failures) for _ in range(50)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays), (failures, min(delays), max(delays))
        assert len(set(delays)) > 1  # jittered: runs that failed together spread out


def test_a_failed_attempt_waits_its_backoff_and_the_broker_is_told_when(personas, ready, settings):
    settings.RETRY_BACKOFF_SECONDS = 60
    test_jobs.CRASH.update(after_fraction=0.5, times=1)
    request = approved_request(personas, job="dwd_order_items_py", start="2022-10-01", end="2022-10-01")
    before = timezone.now()
    ready.drain(skip=in_backoff)

    run = Run.objects.get(request=request)
    assert run.status == RunStatus.QUEUED
    assert [a.status for a in run.attempts.all()] == [AttemptStatus.FAILED]
    failed_at = run.attempts.get().finished_at
    assert failed_at + timedelta(seconds=30) <= run.retry_at <= failed_at + timedelta(seconds=60)
    assert run.enqueued_at == run.retry_at  # the stale-run sweeper counts from when it is due
    assert ready.etas[-1] == ("execution.execute_run", [run.run_id], run.retry_at)
    assert len(ready.sent) == 1  # held, not run
    event = AuditEvent.objects.filter(object_type="run", object_id=str(run.pk), to_state=RunStatus.QUEUED).latest("id")
    assert "retrying in" in event.reason and event.data["retry_at"] == run.retry_at.isoformat()
    assert run.retry_at > before

    # A copy delivered before its time (a re-send) opens no attempt and goes back to wait.
    assert run_execute(run_id=run.run_id) == "backing-off"
    assert run.attempts.count() == 1
    assert ready.etas[-1] == ("execution.execute_run", [run.run_id], run.retry_at)


def test_a_poison_run_spaces_its_attempts_by_the_backoff_then_fails(personas, ready, settings):
    settings.RETRY_BACKOFF_SECONDS = 0.4
    test_jobs.CRASH.update(after_fraction=0.0, times=100)
    request = approved_request(personas, job="dwd_order_items_py", start="2022-10-01", end="2022-10-01")
    deadline = time.time() + 30
    while time.time() < deadline:
        ready.drain(skip=in_backoff)
        run = Run.objects.get(request=request)
        if run.status == RunStatus.FAILED:
            break
        time.sleep(0.05)  # the broker's hold, passing
    assert run.status == RunStatus.FAILED
    attempts = list(run.attempts.order_by("attempt_no"))
    assert [a.status for a in attempts] == [AttemptStatus.FAILED] * run.job.max_attempts == [AttemptStatus.FAILED] * 3
    # after failure n the next attempt waited at least half of 0.4 * 2^(n-1) seconds
    for n, (failed, nxt) in enumerate(zip(attempts, attempts[1:]), start=1):
        assert (nxt.started_at - failed.finished_at).total_seconds() >= 0.5 * 0.4 * 2 ** (n - 1)
    request.refresh_from_db()
    assert request.status == RequestStatus.FAILED
