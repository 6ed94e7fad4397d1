"""A worker's task that the database aborts to break a deadlock is sent again, on
PostgreSQL. The race test: a cancel (the audit chain's lock, then the request's runs)
met a worker that had moved its run and waited for the chain at its audit batch's end;
PostgreSQL aborted the worker's transaction, and its task ended at ERROR with "deadlock
detected" until the sweeper re-sent the run minutes later. Now the task is sent again."""
from __future__ import annotations

import time

import pytest
from django.db import transaction

from backfill_portal.celery import app
from backfill_portal.core.services.audit import audit_serialise
from backfill_portal.execution.choices import RunStatus
from backfill_portal.execution.models import Run
from tests.conftest import needs_postgresql, started_until_waiting
from tests.execution.test_pipeline import approved_request

pytestmark = [pytest.mark.django_db(transaction=True), needs_postgresql("two concurrent transactions")]


def test_an_execute_task_aborted_by_a_deadlock_is_sent_again_and_publishes(personas, catalog, demo_sources,
                                                                          task_queue):
    import backfill_portal.execution.tasks  # noqa: F401  (registers the tasks)

    request = approved_request(personas, start="2022-10-01", end="2022-10-01")
    task_queue.drain(skip=lambda task, args: task == "execution.execute_run")
    (run_id,) = [args[0] for task, args, _, _ in task_queue.sent if task == "execution.execute_run"]
    run = Run.objects.get(run_id=run_id)

    # What a cancel does: the audit chain's lock, then the request's runs.
    with transaction.atomic():
        audit_serialise()
        worker, outcome = started_until_waiting(
            lambda: app.tasks["execution.execute_run"].apply(args=[run_id]).get(), what="the worker")
        time.sleep(0.3)
        Run.objects.filter(pk=run.pk).update(enqueued_at=None)  # waits for the worker's row: the cycle
    worker.join(120)
    assert outcome == ["published"], outcome
    run.refresh_from_db()
    assert run.status == RunStatus.PUBLISHED
    assert request.pk == run.request_id
