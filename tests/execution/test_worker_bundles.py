"""Bundles on a real worker (Redis, PostgreSQL): the worker running two bundles is
killed with kill -9 in the middle; every run of both bundles is retried alone by the
sweeper and published exactly once. Skipped (with the reason) unless CI's second pass
provides PostgreSQL and Redis."""
from __future__ import annotations

import os
import signal
import subprocess

import pytest
import yaml

from backfill_portal.catalog.services.sync import catalog_sync
from backfill_portal.execution.choices import AttemptStatus, RunStatus
from backfill_portal.execution.models import Attempt, Run
from backfill_portal.warehouse.models import Publication
from tests.conftest import TEST_CATALOG
from tests.execution.test_pipeline import approved_request
from tests.execution.test_worker import wait_for, wait_published, wait_request_recovered
from tests.workers import BROKER

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.worker,
    pytest.mark.skipif(not BROKER.startswith("redis"), reason="needs CELERY_BROKER_URL=redis://... (CI's second pass)"),
]


@pytest.fixture
def bundled(catalog):
    """slow_items' dataset again, made by a job that is quick before 2022-10-04 and slow after."""
    plan = yaml.safe_load(TEST_CATALOG)
    dataset = next(d for d in plan["datasets"] if d["name"] == "slow_items")
    plan["datasets"].append({**dataset, "name": "bundled_items"})
    plan["jobs"].append({"name": "bundled_items", "produces": "bundled_items", "reads": [], "kind": "python",
                         "pool": "warehouse", "max_attempts": 3, "heartbeat_timeout_seconds": 3,
                         "callable": "tests.execution.jobs.slow_from_october_4"})
    return catalog_sync(text=yaml.safe_dump(plan))


def test_kill_9_mid_bundle_every_run_of_it_is_retried_alone_and_published_once(
        personas, bundled, start_worker, warehouse):
    # A worker started the plain way with the periodic scheduler: nothing in the test
    # process sweeps. Six seconds a run counts as cheap here, so the slow days go in bundles.
    worker = start_worker(name="test-bundle-worker", queues=None, beat="separate", SWEEP_SECONDS=1,
                          EXECUTION_BUNDLE_MAX_SECONDS="60")
    history = approved_request(personas, job="bundled_items", start="2022-09-28", end="2022-10-02",
                               max_active_intervals=3)
    wait_request_recovered(history, timeout=60)
    request = approved_request(personas, job="bundled_items", start="2022-10-04", end="2022-10-07",
                               max_active_intervals=8)

    def four_running():
        """both bundles' four attempts running on the worker's two processes"""
        return Attempt.objects.filter(run__request=request, status=AttemptStatus.RUNNING).count() == 4

    wait_for(four_running, every=0.1)  # run alone, at most two could run at once
    children = subprocess.run(["pgrep", "-P", str(worker.pid)], capture_output=True, text=True).stdout.split()
    assert children, "the worker has no pool processes"
    for pid in children:
        os.kill(int(pid), signal.SIGKILL)
    runs = list(Run.objects.filter(request=request))
    assert len(runs) == 4
    for run in runs:
        wait_published(run, timeout=90)
        attempts = list(run.attempts.order_by("attempt_no").values_list("status", flat=True))
        assert attempts[0] == AttemptStatus.LOST and attempts[-1] == AttemptStatus.SUCCEEDED, attempts
        assert Publication.objects.filter(version__run=run).count() == 1
        rows = warehouse.read_partition("bundled_items", run.partition_key)
        assert len(rows) == 120 and len({r["n"] for r in rows}) == 120  # not one row more
    assert set(Run.objects.filter(request=request).values_list("status", flat=True)) == {RunStatus.PUBLISHED}
    wait_request_recovered(request)
