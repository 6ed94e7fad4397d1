"""Cancelling (pausing, resuming) while a worker publishes, on PostgreSQL. The exploratory test: on-call's
cancel of a running request was a 500 "deadlock detected" (and did not happen) when it
met a publication: the cancel locked the request's row and then waited for the audit
chain's lock, which the publication held while it waited to move the request's rows.
Now the cancel takes the chain's lock first, and runs again if the database aborts it to
break a deadlock."""
from __future__ import annotations

import time

import pytest
from django.db import transaction

from backfill_portal.backfills.choices import RequestStatus
from backfill_portal.backfills.models import BackfillRequest
from backfill_portal.backfills.services.lifecycle import request_pause, request_resume
from backfill_portal.backfills.services.requests import (
    backfill_request_cancel,
    backfill_request_create,
    backfill_request_submit,
)
from backfill_portal.core.models import AuditEvent
from backfill_portal.core.services.audit import audit_serialise
from tests.conftest import needs_postgresql, started_until_waiting

pytestmark = [pytest.mark.django_db(transaction=True), needs_postgresql("two concurrent transactions")]


@pytest.mark.parametrize("action", ["cancel", "pause", "resume"])
def test_an_operation_meeting_a_transaction_that_holds_the_audit_chain_and_moves_the_request_does_not_deadlock(
        personas, catalog, action):
    request, _ = backfill_request_create(actor=personas["alice"], job="dwd_order_items", reason="late events",
                                         start="2022-10-01", end="2022-10-03")
    backfill_request_submit(actor=personas["alice"], request_id=request.pk, confirm_overlap=True)
    if action != "cancel":  # a running request (paused, to be resumed), set up directly: no worker here
        BackfillRequest.objects.filter(pk=request.pk).update(status=RequestStatus.RUNNING, paused=action == "resume")

    def operate():
        if action == "cancel":
            return backfill_request_cancel(actor=personas["oscar"], request_id=request.pk, reason="wrong range")
        if action == "pause":
            return request_pause(actor=personas["oscar"], request_id=request.pk)
        return request_resume(actor=personas["oscar"], request_id=request.pk)

    # What a publication does: the audit chain's lock, then the request's row.
    with transaction.atomic():
        audit_serialise()
        canceller, outcome = started_until_waiting(operate, what="the operation")
        time.sleep(0.3)  # were it holding the request's row, the UPDATE below would deadlock
        BackfillRequest.objects.filter(pk=request.pk).update(max_active_intervals=2)
    canceller.join(60)
    assert not [o for o in outcome if isinstance(o, Exception)], outcome
    request.refresh_from_db()
    assert request.max_active_intervals == 2
    if action == "cancel":
        assert request.status == RequestStatus.CANCELLED
    else:
        assert (request.status, request.paused) == (RequestStatus.RUNNING, action == "pause")
    assert AuditEvent.objects.filter(action=f"request.{action}", object_id=str(request.pk)).count() == 1


def test_a_resume_that_lost_to_a_cancel_says_the_request_is_cancelled(personas, catalog):
    """The race test: the resume's refusal named the status it read before the cancel
    ("is running and not paused"), so on-call retried a resume of a cancelled request."""
    from backfill_portal.core.errors import ConflictError

    request, _ = backfill_request_create(actor=personas["alice"], job="dwd_order_items", reason="late events",
                                         start="2022-10-01", end="2022-10-03")
    backfill_request_submit(actor=personas["alice"], request_id=request.pk, confirm_overlap=True)
    BackfillRequest.objects.filter(pk=request.pk).update(status=RequestStatus.RUNNING, paused=True)
    with transaction.atomic():
        audit_serialise()  # the resume has read the request and waits for the chain
        resumer, errors = started_until_waiting(
            lambda: request_resume(actor=personas["oscar"], request_id=request.pk), what="the resume")
        BackfillRequest.objects.filter(pk=request.pk).update(status=RequestStatus.CANCELLED, paused=False)
    resumer.join(60)
    assert len(errors) == 1 and isinstance(errors[0], ConflictError), errors
    assert str(errors[0].message) == (f"request #{request.pk} is cancelled; only a paused running request "
                                      "can be resumed")
