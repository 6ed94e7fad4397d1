"""Run.failing, kept by the run's transitions: a run that fails is failing until a later
run of its job and partition is published (then for good: a rollback of that repair does
not bring the failure back); a retry takes it off; a failure of another partition
repairs nothing. The runs list and the on-call home read it (runs_failing); the
migration's fill computes the same flags from the runs' states."""
from __future__ import annotations

import threading
from contextlib import nullcontext
from datetime import datetime, timezone as tz
from importlib import import_module

import pytest
from django.db import connection, transaction

from backfill_portal.catalog.models import Job
from backfill_portal.core.services.audit import audit_batch
from backfill_portal.execution.choices import RunStatus, RunType
from backfill_portal.execution.models import Run
from backfill_portal.execution.selectors import runs_failing
from backfill_portal.execution.services.dispatch import request_retry_failed
from backfill_portal.execution.services.schedule import schedule_production
from backfill_portal.execution.transitions import run_transition
from backfill_portal.recovery.rollback import partition_rollback
from tests.execution import jobs as test_jobs
from tests.execution.test_pipeline import approved_request

pytestmark = pytest.mark.django_db(transaction=True)

JOB = "dwd_order_items_py"
run_failing_fill = import_module("backfill_portal.execution.migrations.0007_run_failing").run_failing_fill


@pytest.fixture
def ready(catalog, demo_sources, task_queue, warehouse):
    yield task_queue
    test_jobs.CRASH.update(after_fraction=None, times=0, let_through=0)


def run_of(personas, queue, day: str, *, crash: bool) -> Run:
    """One interval of JOB on `day`, run to its end; with `crash`, every attempt dies."""
    test_jobs.CRASH.update(after_fraction=0.0 if crash else None, times=100 if crash else 0)
    request = approved_request(personas, job=JOB, start=day, end=day)
    queue.drain()
    return Run.objects.get(request=request)


def failing_ids() -> set[str]:
    return set(runs_failing(Run.objects.all()).values_list("run_id", flat=True))


def flags() -> dict[str, bool]:
    return dict(Run.objects.values_list("run_id", "failing"))


def test_a_failure_stands_until_a_later_run_publishes_its_partition_and_a_rollback_does_not_revive_it(
        personas, ready):
    good = run_of(personas, ready, "2022-10-01", crash=False)
    assert good.status == RunStatus.PUBLISHED and not good.failing
    failed = run_of(personas, ready, "2022-10-01", crash=True)
    assert failed.status == RunStatus.FAILED and failed.failing
    assert failing_ids() == {failed.run_id}

    # A failure of another partition repairs nothing.
    other = run_of(personas, ready, "2022-10-02", crash=True)
    assert other.status == RunStatus.FAILED
    assert failing_ids() == {failed.run_id, other.run_id}

    # A later run publishes 2022-10-01: that failure no longer stands; the other does.
    repair = run_of(personas, ready, "2022-10-01", crash=False)
    assert repair.status == RunStatus.PUBLISHED
    assert failing_ids() == {other.run_id}

    # Rolling the repair back restores the first version (older than the failure): the
    # partition was repaired, and the old failure stays off the on-call lists.
    partition_rollback(actor=personas["oscar"], dataset=JOB, partition_key="2022-10-01", reason="checking the fix")
    repair.refresh_from_db()
    good.refresh_from_db()
    assert (repair.status, good.status) == (RunStatus.ROLLED_BACK, RunStatus.PUBLISHED)
    assert failing_ids() == {other.run_id}

    # The migration's fill, from the states alone, gives the same flags.
    kept = flags()
    Run.objects.update(failing=False)
    assert run_failing_fill(connection) == 1
    assert flags() == kept
    Run.objects.update(failing=True)
    run_failing_fill(connection)
    assert flags() == kept

    # Retrying the other failure takes it off at once (queued again), and it publishes.
    test_jobs.CRASH.update(after_fraction=None, times=0)
    request_retry_failed(actor=personas["alice"], request_id=other.request_id)
    other.refresh_from_db()
    assert other.status == RunStatus.QUEUED and not other.failing
    ready.drain()
    other.refresh_from_db()
    assert other.status == RunStatus.PUBLISHED
    assert failing_ids() == set()


def test_a_scheduled_run_that_fails_verification_is_failing(personas, ready):
    Job.objects.filter(name="dwd_order_items").update(scheduled=True)
    [run_id] = schedule_production(now=datetime(2030, 1, 2, 2, 0, tzinfo=tz.utc))
    ready.drain()
    run = Run.objects.get(run_id=run_id)
    assert (run.status, run.run_type, run.failing) == (RunStatus.VERIFICATION_FAILED, RunType.SCHEDULED, True)
    assert failing_ids() == {run_id}


def walk(run: Run, *states: str) -> None:
    for state in states:
        run_transition(run, to=state)


@pytest.mark.postgres
@pytest.mark.skipif(connection.vendor != "postgresql",
                    reason="two concurrent transactions need PostgreSQL: the SQLite test database is in memory, "
                           "shared by threads without a busy timeout (a file database queues writers: IMMEDIATE)")
@pytest.mark.parametrize("batched", [False, True], ids=["events-written-at-once", "events-in-an-audit-batch"])
@pytest.mark.parametrize("first", ["failure", "publication"])
def test_a_failure_and_a_later_runs_publication_at_once_leave_it_repaired(personas, ready, first, batched):
    """One transaction is still open when the other starts: the failure of an earlier
    run and the publication of a later run of the same partition. Whichever commits
    first, the earlier run ends failed and not failing. Also when the open
    transaction's events wait in an audit batch (its chain lock is then taken for the
    failing flag's read, not by the event)."""
    job = Job.objects.get(name=JOB)
    early, late = (Run.objects.create(job=job, run_type=RunType.MANUAL, partition_key="2022-10-05",
                                      data_interval_start=datetime(2022, 10, 5, tzinfo=tz.utc),
                                      data_interval_end=datetime(2022, 10, 6, tzinfo=tz.utc),
                                      code_version=job.current_code_version) for _ in range(2))
    walk(early, RunStatus.RUNNING)
    walk(late, RunStatus.RUNNING, RunStatus.STAGED, RunStatus.VERIFYING, RunStatus.VERIFIED)
    moves = {"failure": (early, RunStatus.FAILED), "publication": (late, RunStatus.PUBLISHED)}
    second = "publication" if first == "failure" else "failure"
    held, release, done = threading.Event(), threading.Event(), threading.Event()

    def hold() -> None:
        run, to = moves[first]
        try:
            with transaction.atomic(), audit_batch() if batched else nullcontext():
                run_transition(Run.objects.select_related("job__dataset").get(pk=run.pk), to=to)
                held.set()
                release.wait(15)
        finally:
            connection.close()

    def follow() -> None:
        run, to = moves[second]
        try:
            run_transition(Run.objects.select_related("job__dataset").get(pk=run.pk), to=to)
            done.set()
        finally:
            connection.close()

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(15)
    follower = threading.Thread(target=follow)
    follower.start()
    assert not done.wait(1)  # it waits for the open transaction
    release.set()
    holder.join(15)
    follower.join(15)
    assert done.is_set()
    early.refresh_from_db()
    late.refresh_from_db()
    assert (early.status, early.failing, late.status) == (RunStatus.FAILED, False, RunStatus.PUBLISHED)
