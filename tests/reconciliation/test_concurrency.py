"""Several people at one reconciliation at once, on PostgreSQL. The exploratory test:
five recomputes at once were three 500s (duplicate rows), and a recompute that had read
before a sign-off overwrote the signed numbers, leaving a completed request with an
unexplained interval."""
from __future__ import annotations

import threading

import pytest
from django.db import connections

from backfill_portal.backfills.choices import RequestStatus
from backfill_portal.backfills.models import Reconciliation, ReconciliationRow
from backfill_portal.recovery.reconciliation import (
    interval_explain,
    reconciliation_compute,
    reconciliation_recompute,
    reconciliation_signoff,
)
from tests.conftest import needs_postgresql
from tests.reconciliation.helpers import run_request

pytestmark = [pytest.mark.django_db(transaction=True), needs_postgresql("concurrent transactions")]


def at_once(*calls):
    """Run the calls in threads started together; (results, errors)."""
    results, errors, start = [], [], threading.Barrier(len(calls))

    def one(call):
        try:
            start.wait()
            results.append(call())
        except Exception as exc:  # noqa: BLE001 - reported by the caller
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=one, args=(call,)) for call in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return results, errors


def test_recomputes_at_once_all_answer_and_leave_one_set_of_rows(personas, ready):
    request = run_request(personas, ready, start="2022-10-01", end="2022-10-03")
    assert request.status == RequestStatus.RECONCILING
    results, errors = at_once(*[lambda: reconciliation_recompute(actor=personas["olivia"], request_id=request.pk)] * 5)
    assert not errors, errors
    assert len(results) == 5
    assert ReconciliationRow.objects.filter(request=request).count() == 3


def test_a_recompute_racing_a_sign_off_never_changes_the_signed_numbers(personas, ready):
    request = run_request(personas, ready, start="2022-10-01", end="2022-10-03")
    reconciliation_compute(actor=None, request_id=request.pk)
    for row in ReconciliationRow.objects.filter(request=request, verdict="unexplained"):
        interval_explain(actor=personas["olivia"], request_id=request.pk, partition_key=row.partition_key,
                         explanation="checked")
    results, errors = at_once(
        lambda: reconciliation_signoff(actor=personas["olivia"], request_id=request.pk),
        lambda: reconciliation_recompute(actor=personas["olivia"], request_id=request.pk),
        lambda: reconciliation_recompute(actor=personas["oscar"], request_id=request.pk))
    assert all(type(e).__name__ == "ConflictError" for e in errors), errors  # a recompute after it: final
    request.refresh_from_db()
    assert request.status == RequestStatus.COMPLETED
    signed = Reconciliation.objects.get(request=request)
    assert signed.signed_off_at is not None
    assert not ReconciliationRow.objects.filter(request=request, verdict="unexplained").exists()
    assert signed.manifest["verdicts"]["unexplained"] == 0


def test_a_sign_off_and_a_rollback_at_once_agree_with_what_readers_see(personas, ready, warehouse):
    """The exploratory test: the rollback answered 409 yet had moved the pointers (its
    copy of the request predated the sign-off), and the move was recorded later as the
    system's; or a signed-off request kept a rolled-back interval as "matched"."""
    from backfill_portal.core.errors import ConflictError
    from backfill_portal.execution.models import Run
    from backfill_portal.recovery.rollback import partition_rollback, request_rollback
    from backfill_portal.warehouse.models import Publication

    days = ("2022-10-01", "2022-10-02")
    first = run_request(personas, ready, start=days[0], end=days[1])
    second = run_request(personas, ready, start=days[0], end=days[1])
    reconciliation_compute(actor=None, request_id=second.pk)
    results, errors = at_once(
        lambda: reconciliation_signoff(actor=personas["olivia"], request_id=second.pk),
        lambda: request_rollback(actor=personas["oscar"], request_id=second.pk, reason="wrong numbers"))
    assert all(isinstance(e, ConflictError) for e in errors), errors
    second.refresh_from_db()
    moved = {day: warehouse.current("dwd_order_items", day) for day in days}
    earlier = {r.partition_key: r.run_id for r in Run.objects.filter(request=first)}
    if second.status == RequestStatus.ROLLED_BACK:  # the rollback went through (before or after the sign-off)
        assert moved == earlier
        assert set(Publication.objects.filter(action=Publication.Action.ROLLBACK)
                   .values_list("actor__username", flat=True)) == {"oscar"}
    else:  # signed off first, and the rollback refused: nothing moved
        assert second.status == RequestStatus.COMPLETED and moved != earlier
        assert not Publication.objects.filter(action=Publication.Action.ROLLBACK).exists()

    # A partition rollback at the same moment as a sign-off: never a signed-off request
    # whose signed rows call the rolled-back interval matched.
    third = run_request(personas, ready, start=days[0], end=days[1])
    reconciliation_compute(actor=None, request_id=third.pk)
    results, errors = at_once(
        lambda: reconciliation_signoff(actor=personas["olivia"], request_id=third.pk),
        lambda: partition_rollback(actor=personas["oscar"], dataset="dwd_order_items", partition_key=days[0],
                                   reason="doubled"))
    assert all(isinstance(e, ConflictError) for e in errors), errors
    third.refresh_from_db()
    if third.status == RequestStatus.COMPLETED:
        row = ReconciliationRow.objects.get(request=third, partition_key=days[0])
        assert warehouse.current("dwd_order_items", days[0]) == third_run(third, days[0]) or row.verdict != "matched"
    else:
        assert third.status == RequestStatus.RECONCILING  # reopened, or never signed: to be looked at again


def third_run(request, day: str) -> str:
    from backfill_portal.execution.models import Run

    return Run.objects.get(request=request, partition_key=day).run_id
