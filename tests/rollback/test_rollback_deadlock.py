"""A rollback meeting a worker that holds one of the runs it restores and then waits for
the audit chain, on PostgreSQL. Before, the rollback moved the warehouse, took the audit
chain with its first partition's audit row and then waited for the second partition's
run; the worker's wait for the chain closed the cycle, the database aborted the
rollback, and readers were left on the restored versions with no rollback recorded.
Now the rollback locks its runs and requests before the warehouse moves, so it waits
there, holding nothing the worker needs."""
from __future__ import annotations

import time

import pytest
from django.db import transaction

from backfill_portal.backfills.choices import RequestStatus
from backfill_portal.core.services.audit import audit_serialise
from backfill_portal.execution.choices import RunStatus
from backfill_portal.execution.models import Run
from backfill_portal.recovery.rollback import request_rollback
from backfill_portal.warehouse.models import Publication
from tests.conftest import needs_postgresql, started_until_waiting
from tests.reconciliation.helpers import run_request

pytestmark = [pytest.mark.django_db(transaction=True), needs_postgresql("two concurrent transactions")]
DAYS = ("2022-10-01", "2022-10-02")


def test_a_request_rollback_waits_for_a_worker_holding_its_runs_and_the_audit_chain(personas, ready, warehouse):
    first = run_request(personas, ready, start=DAYS[0], end=DAYS[1])
    second = run_request(personas, ready, start=DAYS[0], end=DAYS[1])
    restored = {r.partition_key: r for r in Run.objects.filter(request=first)}
    # What a worker's audit batch does: a run's row first, the audit chain's lock at its end.
    with transaction.atomic():
        list(Run.objects.select_for_update().filter(pk=restored[DAYS[1]].pk).values_list("pk", flat=True))
        rollback, outcome = started_until_waiting(
            lambda: request_rollback(actor=personas["oscar"], request_id=second.pk, reason="wrong numbers"),
            what="the rollback")
        time.sleep(0.3)
        audit_serialise()  # were the rollback holding the chain, this would deadlock
        Run.objects.filter(pk=restored[DAYS[1]].pk).update(verify_heartbeat_at=None)
    rollback.join(60)
    assert not [o for o in outcome if isinstance(o, Exception)], outcome
    second.refresh_from_db()
    assert second.status == RequestStatus.ROLLED_BACK
    assert {day: warehouse.current("dwd_order_items", day) for day in DAYS} == {
        day: run.run_id for day, run in restored.items()}
    assert list(Publication.objects.filter(action=Publication.Action.ROLLBACK)
                .values_list("actor__username", flat=True)) == ["oscar", "oscar"]
    assert set(Run.objects.filter(request=second).values_list("status", flat=True)) == {RunStatus.ROLLED_BACK}
