"""A warehouse that refuses connections holds the work instead of failing it: the
attempt that met the refusal fails without counting, no attempt starts and nothing is
dispatched while the outage lasts, the request page says so, and the probe that finds
the warehouse back resumes everything by itself. In process here (any database); against
a real worker, a real PostgreSQL warehouse behind a TCP proxy that the test stops for
20 s, in test_outage_worker.py."""
from __future__ import annotations

import pytest

from backfill_portal.backfills.choices import IntervalStatus, RequestStatus
from backfill_portal.backfills.models import Interval
from backfill_portal.core.models import AuditEvent
from backfill_portal.execution.choices import AttemptStatus, RunStatus
from backfill_portal.execution.models import Attempt, Run
from backfill_portal.execution.services.dispatch import dispatch_request, warehouse_probe_and_resume
from backfill_portal.execution.services.runs import run_execute
from backfill_portal.warehouse.models import WarehouseOutage
from backfill_portal.backends import reset_warehouse_cache
from tests.execution.test_pipeline import approved_request

pytestmark = pytest.mark.django_db(transaction=True)
REFUSING = "postgresql://nobody@127.0.0.1:1/nowhere?connect_timeout=2"


@pytest.fixture
def ready(catalog, demo_sources, task_queue, warehouse):
    return task_queue


def point_warehouse_at(settings, url: str) -> None:
    settings.WAREHOUSE_URL = url
    reset_warehouse_cache()


def test_a_refusing_warehouse_holds_the_runs_without_spending_attempts_and_a_probe_resumes_them(
        personas, ready, settings, warehouse_url, client):
    request = approved_request(personas, start="2022-10-01", end="2022-10-02")
    point_warehouse_at(settings, REFUSING)
    ready.drain()

    runs = list(Run.objects.filter(request=request))
    assert len(runs) == 2 and {r.status for r in runs} == {RunStatus.QUEUED}
    # The first attempt met the refusal (recorded with its error, not counted); once the
    # outage was open the second run started none.
    (attempt,) = Attempt.objects.filter(run__request=request)
    assert attempt.status == AttemptStatus.FAILED and attempt.outage
    assert "cannot connect to the warehouse" in attempt.error
    outage = WarehouseOutage.objects.get()
    assert outage.status == WarehouseOutage.Status.OPEN and "Connection refused" in outage.error
    assert AuditEvent.objects.filter(action="warehouse.unreachable", object_id=str(outage.pk)).count() == 1
    request.refresh_from_db()
    assert request.status == RequestStatus.RUNNING

    # While it lasts: a delivered run opens no attempt, a newly approved request starts
    # nothing, and the probe finds the warehouse still down.
    assert {run_execute(run_id=run.run_id) for run in runs} == {"warehouse-unreachable"}
    assert Attempt.objects.filter(run__request=request).count() == 1
    other = approved_request(personas, job="dwd_order_items_py", start="2022-10-01", end="2022-10-01")
    ready.drain()
    assert not Run.objects.filter(request=other).exists()
    assert dispatch_request(request_id=other.pk) == 0
    assert warehouse_probe_and_resume() == 0
    outage.refresh_from_db()
    assert outage.status == WarehouseOutage.Status.OPEN and outage.probes >= 2

    client.force_login(personas["alice"])
    page = client.get(f"/requests/{request.pk}/").content.decode()
    assert "paused: warehouse unreachable since" in page and "retrying" in page

    # The warehouse answers again: the probe closes the outage and resumes all of it.
    point_warehouse_at(settings, warehouse_url)
    assert warehouse_probe_and_resume() > 0
    outage.refresh_from_db()
    assert outage.status == WarehouseOutage.Status.CLOSED and outage.ended_at is not None
    assert AuditEvent.objects.filter(action="warehouse_outage.closed", object_id=str(outage.pk)).count() == 1
    ready.drain()
    for req in (request, other):
        req.refresh_from_db()
        assert req.status == RequestStatus.RECONCILING
        assert set(Interval.objects.filter(request=req).values_list("status", flat=True)) == {IntervalStatus.PUBLISHED}
    for run in Run.objects.filter(request=request):
        assert run.status == RunStatus.PUBLISHED
        assert run.attempts.filter(status=AttemptStatus.SUCCEEDED).count() == 1
    assert "warehouse unreachable" not in client.get(f"/requests/{request.pk}/").content.decode()


def test_a_failure_the_warehouse_is_not_to_blame_for_counts_as_an_attempt(personas, ready, settings):
    """The probe decides: the warehouse answers a fresh connection, so the attempt's
    failure is the run's own, and it counts toward max_attempts as before."""
    from tests.execution import jobs as test_jobs

    test_jobs.CRASH.update(after_fraction=0.0, times=100)
    try:
        request = approved_request(personas, job="dwd_order_items_py", start="2022-10-01", end="2022-10-01")
        ready.drain()
    finally:
        test_jobs.CRASH.update(after_fraction=None, times=0)
    run = Run.objects.get(request=request)
    assert run.status == RunStatus.FAILED
    assert run.attempts.count() == run.job.max_attempts and not run.attempts.filter(outage=True).exists()
    assert not WarehouseOutage.objects.exists()
