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
