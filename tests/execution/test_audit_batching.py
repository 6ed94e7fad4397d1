"""The portal's path writes each transaction's audit events as one INSERT (audit_batch):
the chain stays whole, every state change keeps its event, in order, and an event is
written in the transaction of its change."""
from __future__ import annotations

import pytest
from django.db import DatabaseError, connection

from backfill_portal.backfills.services.requests import (
    backfill_request_create,
    backfill_request_decide,
    backfill_request_submit,
)
from backfill_portal.core.models import AuditEvent
from backfill_portal.core.services.audit import audit_check
from backfill_portal.execution.choices import AttemptStatus, RunStatus
from backfill_portal.execution.models import Attempt, Run

pytestmark = pytest.mark.django_db(transaction=True)
TABLE = AuditEvent._meta.db_table


@pytest.fixture
def ready(catalog, demo_sources, task_queue, warehouse):
    return task_queue


def approved(personas, start="2022-10-01", end="2022-10-03"):
    request, _ = backfill_request_create(actor=personas["alice"], job="dwd_order_items", start=start, end=end,
                                         reason="audit batching", max_active_intervals=1)
    backfill_request_submit(actor=personas["alice"], request_id=request.pk, confirm_overlap=True)
    backfill_request_decide(actor=personas["olivia"], request_id=request.pk, approve=True)
    return request


def test_each_interval_writes_its_audit_events_one_insert_per_transaction_and_the_chain_holds(personas, ready):
    request = approved(personas)
    inserts = []

    def count(execute, sql, params, many, context):
        if sql.lstrip().upper().startswith("INSERT") and TABLE in sql:
            inserts.append(len(params) if many else 1)  # rows this INSERT wrote (executed once per row)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(count):
        ready.drain()
    runs = list(Run.objects.filter(request=request).order_by("partition_key"))
    assert [r.status for r in runs] == [RunStatus.PUBLISHED] * 3
    # The execute task's four transactions (attempt start, staging, verdict, publication
    # with the next dispatch), each with one INSERT of several events.
    assert max(inserts) > 1 and sum(inserts) > len(inserts)
    for run in runs:
        moves = list(AuditEvent.objects.filter(object_type="run", object_id=str(run.pk)).order_by("id")
                     .values_list("to_state", flat=True))
        assert moves == [RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.STAGED, RunStatus.VERIFYING,
                         RunStatus.VERIFIED, RunStatus.PUBLISHED]
    assert audit_check().intact


def test_an_audit_insert_that_fails_rolls_back_the_attempts_start(personas, ready):
    """The attempt's start (run running, attempt opened, interval running) and its
    events are one transaction: the events' INSERT failing leaves none of it."""
    request = approved(personas, end="2022-10-01")
    ready.drain(skip=lambda task, args: task == "execution.execute_run")
    run = Run.objects.get(request=request)
    [message] = [m for m in ready.sent if m[0] == "execution.execute_run"]

    def refuse_attempt_events(execute, sql, params, many, context):
        rows = params if many else [params or ()]
        if sql.lstrip().upper().startswith("INSERT") and TABLE in sql and any("attempt.started" in r for r in rows):
            raise DatabaseError("the audit INSERT failed")
        return execute(sql, params, many, context)

    with connection.execute_wrapper(refuse_attempt_events), pytest.raises(DatabaseError):
        ready.drain()
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED
    assert not Attempt.objects.filter(run=run).exists()
    assert not AuditEvent.objects.filter(action="attempt.started").exists()
    assert audit_check().intact
    ready.sent.append(message)  # the broker delivers the message again
    ready.drain()
    run.refresh_from_db()
    assert run.status == RunStatus.PUBLISHED
    assert list(Attempt.objects.filter(run=run).values_list("status", flat=True)) == [AttemptStatus.SUCCEEDED]
    assert audit_check().intact
