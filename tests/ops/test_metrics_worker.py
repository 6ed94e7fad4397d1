"""/metrics over real HTTP while a real Celery worker (two processes) runs a backfill on
PostgreSQL + Redis: the scrapes see the runs move queued -> running -> published; one
worker process is killed -9 mid-attempt, the sweeper marks it lost and the scrape
counts it; at the end every figure equals the database. Skipped (with the reason)
unless CI's second pass provides PostgreSQL and Redis."""
from __future__ import annotations

import os
import signal
import time
import urllib.request

import pytest

from backfill_portal.execution.choices import AttemptStatus, RunStatus
from backfill_portal.execution.models import Attempt, Run
from backfill_portal.execution.services.sweep import sweep_run
from backfill_portal.warehouse.models import Publication
from tests.execution.test_pipeline import approved_request
from tests.execution.test_worker import running_attempt, worker  # noqa: F401  (a fixture: pytest finds it by name)
from tests.ops.metrics import assert_matches_database, parse, value
from tests.workers import BROKER

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.worker,
    pytest.mark.skipif(not BROKER.startswith("redis"), reason="needs CELERY_BROKER_URL=redis://... (CI's second pass)"),
]


def scrape(live_server) -> dict:
    with urllib.request.urlopen(f"{live_server.url}/metrics", timeout=30) as response:
        assert response.status == 200
        return parse(response.read().decode())


def test_scrapes_during_a_worker_backfill_follow_the_runs_and_count_the_lost_attempt(personas, worker, warehouse,
                                                                                     live_server):
    request = approved_request(personas, job="slow_items", start="2022-10-01", end="2022-10-03")
    seen: set[str] = set()
    killed = False
    deadline = time.time() + 150
    while time.time() < deadline:
        samples = scrape(live_server)
        states = {state for state in RunStatus.values if value(samples, "backfill_runs", state=state, type="backfill")}
        seen |= states
        # Never more runs in all states than the plan has intervals.
        assert sum(value(samples, "backfill_runs", state=s, type="backfill") for s in RunStatus.values) <= 3
        if not killed:
            for run in Run.objects.filter(request=request).order_by("id"):
                attempt = running_attempt(run)
                if attempt is not None and time.time() - attempt.started_at.timestamp() > 1.5:  # well into the work
                    os.kill(int(attempt.worker.rsplit(":", 1)[-1]), signal.SIGKILL)
                    killed = True
                    break
        if killed:
            sweep_run(actor=None)
        if Run.objects.filter(request=request, status=RunStatus.PUBLISHED).count() == 3:
            break
        time.sleep(0.5)
    assert killed
    assert Run.objects.filter(request=request, status=RunStatus.PUBLISHED).count() == 3
    samples = scrape(live_server)
    assert_matches_database(samples)
    assert {RunStatus.QUEUED, RunStatus.RUNNING} <= seen
    assert value(samples, "backfill_runs", state="published", type="backfill") == 3
    assert value(samples, "backfill_attempts_lost_total") == 1 == Attempt.objects.filter(status=AttemptStatus.LOST).count()
    assert value(samples, "backfill_sweeper_actions_total", action="lost") == 1
    assert value(samples, "backfill_publish_latency_seconds_count") == 3 == Publication.objects.count()
    # The lost attempt's run was retried and published once.
    lost_run = Attempt.objects.get(status=AttemptStatus.LOST).run
    assert lost_run.attempts.filter(status=AttemptStatus.SUCCEEDED).count() == 1
    assert Publication.objects.filter(version__run=lost_run).count() == 1
