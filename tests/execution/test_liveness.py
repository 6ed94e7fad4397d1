"""Every waiting state moves on by itself: a verification whose verifier died is
reclaimed (and a reclaimed verifier is fenced), a heartbeat outlives a failed beat, a
message the broker lost is sent again within about a heartbeat timeout, and a plain
worker consumes the sweeper's queue. The same faults against a real worker are in
test_worker.py."""
from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.utils import timezone

from backfill_portal.celery import app
from backfill_portal.core.models import AuditEvent
from backfill_portal.execution.checks import VerificationCheck, register_check
from backfill_portal.execution.checks import registry as checks_registry
from backfill_portal.execution.choices import RunStatus
from backfill_portal.execution.models import Run, TaskOutbox
from backfill_portal.execution.services import dispatch as dispatch_service
from backfill_portal.execution.services.dispatch import runs_resend_stale
from backfill_portal.execution.services.runs import Heartbeat
from backfill_portal.execution.services.verify import (
    run_verify,
    runs_reclaim_verifying,
    verification_beat,
    verification_claim,
)
from backfill_portal.warehouse.models import Publication
from tests.execution.test_pipeline import approved_request

pytestmark = pytest.mark.django_db(transaction=True)

LATER = timedelta(hours=1)


@pytest.fixture
def ready(catalog, demo_sources, task_queue, warehouse):
    return task_queue


def staged_run(personas, ready, **kwargs) -> Run:
    """One interval, executed and staged; its verify task left undelivered."""
    request = approved_request(personas, start="2022-10-01", end="2022-10-01", **kwargs)
    ready.drain_to_staged()
    run = Run.objects.get(request=request, run_type="backfill")
    assert run.status == RunStatus.STAGED
    return run


def test_a_plain_worker_consumes_the_sweepers_queue_as_well_as_the_backfill_queue():
    # `celery worker` without -Q consumes every declared queue; the sweeper's is one.
    assert set(app.amqp.queues) == {"production", "backfill"}
    assert app.amqp.router.route({}, "execution.sweep")["queue"].name == "production"
    assert app.amqp.router.route({}, "execution.execute_run")["queue"].name == "backfill"


def test_a_verification_whose_verifier_died_after_its_claim_is_reclaimed_and_publishes_once(personas, ready):
    run = staged_run(personas, ready)
    assert verification_claim(run) is not None  # the verifier claims it, then dies
    assert run_verify(run_id=run.run_id) == "skipped-verifying"  # what a redelivery finds
    assert runs_reclaim_verifying() == 0  # its beat is fresh: it may be working
    assert runs_reclaim_verifying(now=timezone.now() + LATER) == 1
    run.refresh_from_db()
    assert run.status == RunStatus.STAGED and run.verify_heartbeat_at is None
    event = AuditEvent.objects.filter(object_type="run", object_id=str(run.pk), action="run.staged").latest("pk")
    assert event.from_state == "verifying" and event.reason.startswith("verification lost: no heartbeat since")
    assert runs_reclaim_verifying(now=timezone.now() + LATER) == 0  # twice changes nothing
    ready.drain()
    run.refresh_from_db()
    assert run.status == RunStatus.PUBLISHED
    assert Publication.objects.filter(version__run=run).count() == 1


def test_a_reclaimed_verifier_that_wakes_up_changes_nothing(personas, ready):
    run = staged_run(personas, ready)
    taken_over = []

    class FrozenWhileChecking(VerificationCheck):
        """Runs last, once: while this verifier is frozen, the sweeper reclaims the run
        and a second verifier claims it; then this one wakes up with its (passing) checks."""

        name = "zz_frozen_while_checking"
        order = 10_000

        def run(self, ctx):
            if not taken_over:
                assert runs_reclaim_verifying(now=timezone.now() + LATER) == 1
                fresh = Run.objects.select_related("job__dataset").get(pk=ctx.run.pk)
                taken_over.append(verification_claim(fresh))
            yield self.result(True)

    with checks_registry.scoped():
        register_check(FrozenWhileChecking)
        assert run_verify(run_id=run.run_id) == "fenced"
    run.refresh_from_db()
    assert run.status == RunStatus.VERIFYING  # the second verifier's, untouched
    assert run.verify_token == taken_over[0]["verify_token"]
    assert verification_beat(run_pk=run.pk, fence={"verify_token": run.verify_token - 1}) is False
    assert not Publication.objects.filter(version__run=run).exists()
    # The second verifier dies too; the sweeper reclaims again and the run publishes once.
    assert runs_reclaim_verifying(now=timezone.now() + LATER) == 1
    ready.drain()
    run.refresh_from_db()
    assert run.status == RunStatus.PUBLISHED
    assert Publication.objects.filter(version__run=run).count() == 1


def test_an_original_waiting_for_its_second_rerun_is_not_reclaimed(personas, ready):
    run = staged_run(personas, ready, verify_twice=True)
    ready.drain(skip=lambda task, args: task == "execution.execute_run")
    run.refresh_from_db()
    assert run.status == RunStatus.VERIFYING and run.verify_heartbeat_at is None
    assert runs_reclaim_verifying(now=timezone.now() + LATER) == 0
    ready.drain()
    run.refresh_from_db()
    assert run.status == RunStatus.PUBLISHED


def test_a_heartbeat_goes_on_after_a_beat_that_failed():
    calls = []
    done = threading.Event()

    def beat():
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("the metadata database is restarting")
        if len(calls) >= 3:
            done.set()
        return True

    with Heartbeat(beat=beat, every=0.2) as heartbeat:
        assert done.wait(10), f"only {len(calls)} beat(s)"
        assert not heartbeat.fenced.is_set()


def test_a_heartbeat_that_finds_its_work_taken_sets_fenced():
    with Heartbeat(beat=lambda: False, every=0.2) as heartbeat:
        assert heartbeat.fenced.wait(10)


def test_runs_whose_messages_the_broker_lost_are_sent_again_after_a_heartbeat_timeout(personas, ready, monkeypatch):
    request = approved_request(personas, start="2022-10-01", end="2022-10-02")
    ready.drain(skip=lambda task, args: task == "execution.execute_run")
    runs = list(Run.objects.filter(request=request, status=RunStatus.QUEUED))
    assert len(runs) == 2
    timeout = runs[0].job.heartbeat_timeout_seconds
    sent_before = TaskOutbox.objects.filter(task="execution.execute_run").count()
    depth = {"backfill": 2}
    monkeypatch.setattr(dispatch_service, "broker_queue_depth", lambda queue: depth.get(queue, 0))
    soon = timezone.now() + timedelta(seconds=timeout + 1)
    # Both messages are still in the queue: a backlog, nothing is sent again.
    assert runs_resend_stale(now=soon) == 0
    # The broker restarted without its data: both are sent again, once.
    depth["backfill"] = 0
    assert runs_resend_stale(now=timezone.now()) == 0  # not before a heartbeat timeout
    assert runs_resend_stale(now=soon) == 2
    assert TaskOutbox.objects.filter(task="execution.execute_run").count() == sent_before + 2
    resent_at = Run.objects.get(pk=runs[0].pk).enqueued_at
    assert runs_resend_stale(now=resent_at + timedelta(seconds=timeout - 1)) == 0  # not again before another timeout
    # A broker that cannot count falls back to the ten-minute rule.
    depth.clear()
    monkeypatch.setattr(dispatch_service, "broker_queue_depth", lambda queue: None)
    assert runs_resend_stale(now=resent_at + timedelta(seconds=timeout + 1)) == 0
    assert runs_resend_stale(now=resent_at + timedelta(seconds=601)) == 2
    # The duplicates are harmless: each run publishes once.
    ready.drain()
    for run in runs:
        run.refresh_from_db()
        assert run.status == RunStatus.PUBLISHED
        assert Publication.objects.filter(version__run=run).count() == 1
