"""The dispatcher's slot gates below the request's own: the job's max concurrent runs,
its team's, and the pool's slots with some reserved for production work."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from backfill_portal.catalog.models import Job, Pool, Team
from backfill_portal.execution.choices import RunStatus, RunType
from backfill_portal.execution.models import Run
from backfill_portal.execution.services.dispatch import free_slots

pytestmark = pytest.mark.django_db

START = datetime(2022, 10, 1, tzinfo=timezone.utc)


def active(job_name: str, n: int, status: str = RunStatus.RUNNING) -> None:
    job = Job.objects.get(name=job_name)
    for i in range(n):
        Run.objects.create(job=job, run_type=RunType.BACKFILL, partition_key=f"p{i}", status=status,
                           data_interval_start=START + timedelta(days=i), data_interval_end=START + timedelta(days=i + 1),
                           code_version=job.current_code_version)


def slots(job_name: str, *, production: bool = False) -> int:
    job = Job.objects.select_related("dataset__team", "pool").get(name=job_name)
    return free_slots(job, production=production)


@pytest.fixture
def roomy(catalog):
    """Limits wide enough that only the gate under test binds."""
    Job.objects.update(max_concurrent_runs=50)
    Team.objects.update(max_concurrent_runs=50)
    Pool.objects.filter(name="warehouse").update(slots=8, reserved_for_production=2)


def test_pool_slots_keep_the_reserved_ones_for_production(roomy):
    assert slots("dwd_order_items") == 6
    assert slots("dwd_order_items", production=True) == 8
    # Runs of other jobs and teams in the same pool take its slots too.
    active("dws_sales_daily", 3)
    active("monthly_summary", 2, status=RunStatus.VERIFYING)
    assert slots("dwd_order_items") == 1
    assert slots("dwd_order_items", production=True) == 3
    active("page_views_hourly", 1, status=RunStatus.QUEUED)
    assert slots("dwd_order_items") == 0
    # Finished runs hold nothing.
    active("slow_items", 4, status=RunStatus.PUBLISHED)
    active("slow_items", 1, status=RunStatus.FAILED)
    assert slots("dwd_order_items", production=True) == 2


def test_team_limit_counts_every_job_of_the_team_and_only_those(roomy):
    Team.objects.filter(name="core-data").update(max_concurrent_runs=3)
    active("dws_sales_daily", 2)  # analytics: not core-data's
    assert slots("dwd_order_items") == 3
    active("slow_items", 1)
    active("page_views_hourly", 1)
    assert slots("dwd_order_items") == 1
    assert slots("dws_sales_daily") == 2  # its team has room; the pool (6 for backfills, 4 taken) does not


def test_job_limit_counts_only_the_jobs_own_runs(roomy):
    Job.objects.filter(name="dwd_order_items").update(max_concurrent_runs=2)
    active("dwd_order_items_py", 2)
    assert slots("dwd_order_items") == 2
    active("dwd_order_items", 1)
    assert slots("dwd_order_items") == 1
    active("dwd_order_items", 1, status=RunStatus.STAGED)
    assert slots("dwd_order_items") == 0
