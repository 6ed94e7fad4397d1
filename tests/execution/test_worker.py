"""Faults against a real Celery worker on Redis and PostgreSQL: kill -9 mid-run, and
SIGSTOP past the heartbeat timeout then SIGCONT. Skipped (with the reason) unless CI's
second pass provides PostgreSQL and Redis."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from backfill_portal.execution.choices import AttemptStatus, RunStatus
from backfill_portal.execution.models import Attempt, Run
from backfill_portal.execution.services.runs import attempts_sweep_lost
from backfill_portal.warehouse.models import Publication
from backfill_portal.warehouse.registry import spec_for
from tests.execution.test_pipeline import approved_request

ROOT = Path(__file__).resolve().parents[2]
BROKER = os.environ.get("CELERY_BROKER_URL", "")

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.worker,
    pytest.mark.skipif(not BROKER.startswith("redis"), reason="needs CELERY_BROKER_URL=redis://... (CI's second pass)"),
]


@pytest.fixture
def worker(warehouse_url, catalog):
    if connection.vendor != "postgresql":
        pytest.skip("a worker process needs a database it can share: PostgreSQL (DATABASE_URL)")
    db = settings.DATABASES["default"]
    env = {
        **os.environ,
        "DATABASE_URL": f"postgres://{db['USER'] or 'postgres'}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}",
        "WAREHOUSE_URL": warehouse_url,
        "CELERY_BROKER_URL": BROKER,
        "LOG_LEVEL": "INFO",
    }
    subprocess.run([sys.executable, "-m", "celery", "-A", "backfill_portal", "purge", "-f", "-Q", "production,backfill"],
                   cwd=ROOT, env=env, capture_output=True, timeout=60)
    log = open(Path(settings.VAR_DIR) / f"test-worker-{os.getpid()}.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "backfill_portal", "worker", "-Q", "production,backfill",
         "--concurrency", "2", "--prefetch-multiplier", "1", "--without-mingle", "--without-gossip", "-n", f"test{os.getpid()}@%h"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    time.sleep(4)
    yield proc
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
    log.close()


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
