"""Faults against a real Celery worker on Redis and PostgreSQL: kill -9 mid-run, and
SIGSTOP past the heartbeat timeout then SIGCONT; then, with a worker started the plain
way and the periodic scheduler (nothing in the test process sweeps): kill -9 mid-run,
kill -9 during verification, a worker frozen holding the staging lock, and messages
the broker lost. Skipped (with the reason) unless CI's second pass provides
PostgreSQL and Redis."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from backfill_portal.backfills.choices import RequestStatus
from backfill_portal.catalog.services.sync import catalog_sync
from backfill_portal.core.models import AuditEvent
from backfill_portal.execution.choices import AttemptStatus, RunStatus
from backfill_portal.execution.models import Attempt, CheckResult, Run
from backfill_portal.execution.services.dispatch import dispatch_request
from backfill_portal.execution.services.runs import attempts_sweep_lost
from backfill_portal.warehouse.models import Publication
from backfill_portal.catalog.specs import spec_for
from tests.conftest import TEST_CATALOG
from tests.execution.test_pipeline import approved_request
from tests.workers import BROKER, ROOT, worker_env

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.worker,
    pytest.mark.skipif(not BROKER.startswith("redis"), reason="needs CELERY_BROKER_URL=redis://... (CI's second pass)"),
]


@pytest.fixture
def worker(start_worker):
    """A worker on both queues, no scheduler: what sweeping there is, the test does."""
    return start_worker(name="test-worker", SWEEP_SECONDS=1)


@pytest.fixture
def plain_worker(start_worker):
    """start() -> a worker started the plain way (`celery -A backfill_portal worker`,
    no -Q) and the periodic scheduler: nothing in the test process sweeps."""
    return lambda: start_worker(name="test-plain-worker", queues=None, beat="separate", SWEEP_SECONDS=1)


def wait_for(predicate, timeout=60.0, every=0.3):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {predicate.__doc__ or predicate}")


def running_attempt(run):
    """a running attempt with its worker pid"""
    attempt = Attempt.objects.filter(run=run, status=AttemptStatus.RUNNING).order_by("-attempt_no").first()
    return attempt if attempt and attempt.worker.rsplit(":", 1)[-1].isdigit() else None


def sweep_until_published(run, timeout=90):
    deadline = time.time() + timeout
    while time.time() < deadline:
        run.refresh_from_db()
        if run.status in (RunStatus.PUBLISHED, RunStatus.FAILED, RunStatus.VERIFICATION_FAILED):
            return run
        attempts_sweep_lost()
        time.sleep(0.5)
    raise AssertionError(f"run stayed {run.status}")


def assert_published_once_without_duplicates(run, warehouse):
    assert run.status == RunStatus.PUBLISHED, run.error
    assert Publication.objects.filter(version__run=run).count() == 1
    profile = warehouse.profile(spec=spec_for(run.job.dataset), run_id=run.run_id)
    assert profile.duplicate_keys == 0 and profile.row_count == 120
    rows = warehouse.read_partition("slow_items", run.partition_key)
    assert len(rows) == 120 and len({r["n"] for r in rows}) == 120


def test_kill_9_mid_run_loses_the_attempt_and_the_next_one_publishes_once(personas, worker, warehouse):
    request = approved_request(personas, job="slow_items", start="2022-10-01", end="2022-10-01")
    run = wait_for(lambda: Run.objects.filter(request=request).first())
    attempt = wait_for(lambda: running_attempt(run))
    time.sleep(1.5)  # well into the work
    os.kill(int(attempt.worker.rsplit(":", 1)[-1]), signal.SIGKILL)
    run = sweep_until_published(run)
    attempts = list(run.attempts.order_by("attempt_no"))
    assert attempts[0].status == AttemptStatus.LOST
    assert attempts[-1].status == AttemptStatus.SUCCEEDED
    assert_published_once_without_duplicates(run, warehouse)


def test_sigstop_past_the_heartbeat_timeout_then_sigcont_cannot_publish(personas, worker, warehouse):
    request = approved_request(personas, job="slow_items", start="2022-10-02", end="2022-10-02")
    run = wait_for(lambda: Run.objects.filter(request=request).first())
    stale = wait_for(lambda: running_attempt(run))
    pid = int(stale.worker.rsplit(":", 1)[-1])
    time.sleep(1.0)
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(run.job.heartbeat_timeout_seconds + 2)
        assert attempts_sweep_lost() == 1
        stale.refresh_from_db()
        assert stale.status == AttemptStatus.LOST
        # The other worker process takes the next attempt.
        wait_for(lambda: Attempt.objects.filter(run=run, attempt_no__gt=stale.attempt_no).exists())
    finally:
        os.kill(pid, signal.SIGCONT)
    run = sweep_until_published(run)
    time.sleep(3)  # let the stale process finish and try its luck
    stale.refresh_from_db()
    assert stale.status == AttemptStatus.LOST  # its late success was refused
    run.refresh_from_db()
    assert_published_once_without_duplicates(run, warehouse)


# -- every state moves on by itself, with nothing in the test process sweeping ----------

def wait_published(run, timeout=60.0):
    def published():
        """the run to be published"""
        run.refresh_from_db()
        assert run.status not in (RunStatus.FAILED, RunStatus.VERIFICATION_FAILED, RunStatus.CANCELLED), run.error
        return run.status == RunStatus.PUBLISHED

    wait_for(published, timeout=timeout)
    return run


def wait_request_recovered(request, timeout=30.0):
    def recovered():
        """the request to reach reconciling"""
        request.refresh_from_db()
        return request.status in (RequestStatus.RECONCILING, RequestStatus.COMPLETED)

    wait_for(recovered, timeout=timeout)


def test_a_plain_worker_sweeps_a_killed_attempt_and_the_request_recovers(personas, plain_worker, warehouse):
    plain_worker()
    request = approved_request(personas, job="slow_items", start="2022-10-03", end="2022-10-03")
    run = wait_for(lambda: Run.objects.filter(request=request).first())
    attempt = wait_for(lambda: running_attempt(run))
    time.sleep(1.5)  # well into the work
    os.kill(int(attempt.worker.rsplit(":", 1)[-1]), signal.SIGKILL)
    run = wait_published(run)
    assert [a.status for a in run.attempts.order_by("attempt_no")][0] == AttemptStatus.LOST
    assert_published_once_without_duplicates(run, warehouse)
    wait_request_recovered(request)


SLOW_CHECK = "SELECT 1 AS failing FROM (SELECT CAST(pg_sleep(4) AS TEXT) AS slept) AS s WHERE s.slept = 'never'"


@pytest.fixture
def slow_checked(catalog):
    """slow_items' rows at once, then a verification that takes four seconds."""
    plan = yaml.safe_load(TEST_CATALOG)
    dataset = next(d for d in plan["datasets"] if d["name"] == "slow_items")
    plan["datasets"].append({**dataset, "name": "slow_checked", "checks": [{"name": "slow_check", "sql": SLOW_CHECK}]})
    plan["jobs"].append({"name": "slow_checked", "produces": "slow_checked", "reads": [], "kind": "python",
                         "pool": "warehouse", "max_attempts": 3, "heartbeat_timeout_seconds": 3,
                         "callable": "tests.execution.jobs.quick_items"})
    return catalog_sync(text=yaml.safe_dump(plan))


def test_kill_9_during_verification_the_sweeper_reclaims_it_and_the_run_publishes_once(
        personas, slow_checked, plain_worker, warehouse):
    worker = plain_worker()
    request = approved_request(personas, job="slow_checked", start="2022-10-04", end="2022-10-04")
    run = wait_for(lambda: Run.objects.filter(request=request).first())

    def verifying():
        """the run to be verifying"""
        run.refresh_from_db()
        return run.status == RunStatus.VERIFYING

    wait_for(verifying, every=0.1)
    time.sleep(1.0)  # inside the slow check
    children = subprocess.run(["pgrep", "-P", str(worker.pid)], capture_output=True, text=True).stdout.split()
    assert children, "the worker has no pool processes"
    for pid in children:  # every pool process: the verifier is one of them
        os.kill(int(pid), signal.SIGKILL)
    run = wait_published(run)
    lost = AuditEvent.objects.filter(object_type="run", object_id=str(run.pk), action="run.staged",
                                     from_state=RunStatus.VERIFYING, reason__startswith="verification lost")
    assert lost.count() == 1, list(AuditEvent.objects.filter(object_type="run", object_id=str(run.pk))
                                   .values_list("action", "from_state", "reason"))
    assert Publication.objects.filter(version__run=run).count() == 1
    assert CheckResult.objects.get(run=run, name="slow_check").passed
    assert len(warehouse.read_partition("slow_checked", run.partition_key)) == 120
    wait_request_recovered(request)


def test_a_worker_frozen_holding_the_staging_lock_does_not_block_the_retry(personas, plain_worker, warehouse):
    plain_worker()
    request = approved_request(personas, job="slow_items", start="2022-10-05", end="2022-10-05")
    run = wait_for(lambda: Run.objects.filter(request=request).first())
    frozen = wait_for(lambda: running_attempt(run))
    pid = int(frozen.worker.rsplit(":", 1)[-1])
    time.sleep(1.5)  # inside its staging transaction, holding the run's lock
    os.kill(pid, signal.SIGSTOP)
    try:
        # Still frozen: the sweeper declares it lost, the next attempt ends its
        # warehouse session (its lock and rows go) and publishes.
        run = wait_published(run)
    finally:
        os.kill(pid, signal.SIGCONT)
    time.sleep(3)  # let the woken process try its luck
    frozen.refresh_from_db()
    assert frozen.status == AttemptStatus.LOST
    run.refresh_from_db()
    assert_published_once_without_duplicates(run, warehouse)
    wait_request_recovered(request)


def test_messages_a_broker_lost_are_sent_again_within_about_a_heartbeat_timeout(personas, plain_worker, warehouse):
    request = approved_request(personas, job="slow_items", start="2022-10-06", end="2022-10-07")
    dispatch_request(request_id=request.pk)  # the runs' messages go to the broker; no worker yet
    runs = list(Run.objects.filter(request=request))
    assert len(runs) == 2 and {r.status for r in runs} == {RunStatus.QUEUED}
    # The broker loses everything it held (a Redis restarted without persistence).
    flushed = subprocess.run(["redis-cli", "-u", BROKER, "FLUSHDB"], capture_output=True, text=True, timeout=30)
    assert flushed.stdout.strip() == "OK", flushed
    plain_worker()
    for run in runs:
        wait_published(run, timeout=60)  # the ten-minute resend would not make it
        assert_published_once_without_duplicates(run, warehouse)
    wait_request_recovered(request)


# The approving process (a web server, say) is killed right after the approval commits,
# before its hand-off starts the request: nothing in any queue says the request exists.
APPROVE_AND_DIE = """
import os, signal
import django
django.setup()
from django.contrib.auth.models import User
from django.db import transaction
from backfill_portal.backfills.services.requests import backfill_request_decide
with transaction.atomic():
    transaction.on_commit(lambda: os.kill(os.getpid(), signal.SIGKILL))
    backfill_request_decide(actor=User.objects.get(username="olivia"), request_id=int(os.environ["REQUEST_ID"]),
                            approve=True)
"""


def test_a_process_killed_right_after_committing_an_approval_leaves_a_request_that_recovers_by_itself(
        personas, start_worker, warehouse_url, warehouse):
    from backfill_portal.backfills.models import Reconciliation
    from backfill_portal.backfills.services.requests import backfill_request_create, backfill_request_submit

    # A plain worker and the scheduler; its sweeper waits 3 s for a hand-off before doing it.
    start_worker(name="test-plain-worker", queues=None, beat="separate", SWEEP_SECONDS=1, SWEEP_GRACE_SECONDS=3)
    request, _ = backfill_request_create(actor=personas["alice"], job="slow_items", start="2022-10-08",
                                         end="2022-10-08", reason="bug 4711 fixed")
    backfill_request_submit(actor=personas["alice"], request_id=request.pk)
    approver = subprocess.run([sys.executable, "-c", APPROVE_AND_DIE], cwd=ROOT, capture_output=True, text=True,
                              timeout=120, env={**worker_env(warehouse_url), "REQUEST_ID": str(request.pk),
                                                "DJANGO_SETTINGS_MODULE": "backfill_portal.settings"})
    assert approver.returncode == -signal.SIGKILL, approver.stderr[-2000:]
    request.refresh_from_db()
    assert request.status == RequestStatus.APPROVED and not Run.objects.filter(request=request).exists()

    def reconciled():
        """the request to be reconciled"""
        return Reconciliation.objects.filter(request=request).exists()

    wait_for(reconciled, timeout=90)
    request.refresh_from_db()
    assert request.status == RequestStatus.RECONCILING
    run = Run.objects.get(request=request)
    assert_published_once_without_duplicates(run, warehouse)
    start = AuditEvent.objects.get(request_id=request.pk, action="request.start")
    assert start.actor_id is None and start.from_state == RequestStatus.APPROVED
    assert sum(e.data.get("started", 0) for e in AuditEvent.objects.filter(action="sweep.repaired")) == 1
