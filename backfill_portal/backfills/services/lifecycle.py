"""The request's state after approval: what execution and recovery report, and the
operator's pause and resume. Backfills is the only writer of request state.

The layers above call these services (down) instead of moving a request themselves.
Each checks its rule (the allowed edge, claimed by `request_transition`), applies it and
writes its audit row, in the caller's transaction; what must happen above afterwards
is enqueued by task name through the outbox (`core/outbox.py`), in that transaction.
The human decisions before this (create, submit, approve, reject, cancel) and the start
after approval are in `requests.py`.
"""
from __future__ import annotations

from django.db import transaction

from backfill_portal.backfills import policy
from backfill_portal.backfills.choices import RequestStatus as R
from backfill_portal.backfills.models import BackfillRequest
from backfill_portal.backfills.selectors import request_get
from backfill_portal.backfills.services.handoff import handoffs_open_for
from backfill_portal.backfills.services.run_control import run_control
from backfill_portal.backfills.transitions import request_transition
from backfill_portal.core.errors import ConflictError
from backfill_portal.core.outbox import enqueue
from backfill_portal.core.retry import run_again_if_deadlocked
from backfill_portal.core.services.audit import audit_record, audit_serialise

# -- what execution reports -------------------------------------------------------------------


def request_fail(request: BackfillRequest, *, failed: int) -> BackfillRequest:
    """running -> failed: no work left, and `failed` intervals failed after their last attempt."""
    return request_transition(request, to=R.FAILED, actor=None, action="request.failed",
                              reason=f"{failed} interval(s) failed after their last attempt",
                              data={"failed": failed})


def request_reconciling(request: BackfillRequest) -> BackfillRequest:
    """running -> reconciling: every interval published or skipped. Its reconciliation
    is computed by a task; a hand-off cascade opens its items once this commits."""
    request_transition(request, to=R.RECONCILING, actor=None, action="request.reconciling",
                       reason="every interval published or skipped; reconciliation pending")
    enqueue("backfills.reconcile_request", request.pk, headers={"request_id": request.pk})
    pk = request.pk
    transaction.on_commit(lambda: handoffs_open_for(request_id=pk))
    return request


def request_resume_after_failure(request: BackfillRequest, *, actor, failed: int) -> BackfillRequest:
    """failed -> running: its `failed` intervals are retried (execution queues their runs)."""
    return request_transition(request, to=R.RUNNING, actor=actor, action="request.retry_failed",
                              reason=f"retrying {failed} failed interval(s)")


# -- what recovery reports ---------------------------------------------------------------------


def request_complete(request: BackfillRequest, *, actor, reason: str, data: dict) -> BackfillRequest:
    """reconciling -> completed: its reconciliation was signed off."""
    return request_transition(request, to=R.COMPLETED, actor=actor, action="request.signoff", reason=reason,
                              data=data)


def request_reopen(request: BackfillRequest, *, actor, reason: str, signed_off: dict | None) -> BackfillRequest:
    """completed -> reconciling: an input of what it published was rolled back, so its
    reconciliation must be looked at again (`signed_off`: the sign-off withdrawn)."""
    return request_transition(request, to=R.RECONCILING, actor=actor, action="request.reopen",
                              reason=f"an input of what it published was rolled back: {reason}",
                              updates={"finished_at": None}, data={"signed_off": signed_off})


def request_rolled_back(request: BackfillRequest, *, actor, reason: str, partitions: list[dict]) -> BackfillRequest:
    """-> rolled_back: every partition it published shows its previous version again."""
    return request_transition(request, to=R.ROLLED_BACK, actor=actor, action="request.rollback", reason=reason,
                              data={"partitions": partitions})


# -- the operator: pause and resume ------------------------------------------------------


def request_pause(*, actor, request_id) -> BackfillRequest:
    """Nothing new is dispatched; running work finishes."""
    request = request_get(request_id)
    policy.require_operate(actor, request, "request.pause")

    def pause() -> None:
        with transaction.atomic():
            audit_serialise()  # the audit chain's lock before the request's row, as cancel (core/retry.py)
            claimed = BackfillRequest.objects.filter(pk=request.pk, status=R.RUNNING, paused=False).update(paused=True)
            if claimed != 1:
                # Read again: the copy above may be older than the pause that beat this one.
                status, paused = BackfillRequest.objects.values_list("status", "paused").get(pk=request.pk)
                if status == R.RUNNING and paused:
                    raise ConflictError(f"request #{request.pk} is already paused; resume it to dispatch again",
                                        field="status")
                raise ConflictError(f"request #{request.pk} is {status}; only a running request can be paused",
                                    field="status")
            audit_record(actor=actor, action="request.pause", object_type="request", object_id=request.pk,
                         request_id=request.pk, dataset=request.job.dataset.name, from_state="running",
                         to_state="paused")

    run_again_if_deadlocked(pause, what=f"pausing request #{request.pk}")
    request.paused = True
    return request


def request_resume(*, actor, request_id) -> BackfillRequest:
    """Resume a paused request (dispatch again) or retry a failed one."""
    request = request_get(request_id)
    policy.require_operate(actor, request, "request.resume")
    if request.status == R.FAILED:
        return run_control().retry_failed(actor=actor, request_id=request_id)

    def resume() -> None:
        with transaction.atomic():
            audit_serialise()  # as pause
            claimed = BackfillRequest.objects.filter(pk=request.pk, status=R.RUNNING, paused=True).update(paused=False)
            if claimed != 1:
                # Read again, as pause does: a cancel that beat this resume made the copy above stale.
                status, paused = BackfillRequest.objects.values_list("status", "paused").get(pk=request.pk)
                if status == R.RUNNING and not paused:
                    raise ConflictError(f"request #{request.pk} is running and not paused; nothing to resume",
                                        field="status")
                raise ConflictError(f"request #{request.pk} is {status}; only a paused running request can be "
                                    "resumed", field="status")
            audit_record(actor=actor, action="request.resume", object_type="request", object_id=request.pk,
                         request_id=request.pk, dataset=request.job.dataset.name, from_state="paused",
                         to_state="running")
            enqueue("execution.dispatch_request", request.pk, headers={"request_id": request.pk})

    run_again_if_deadlocked(resume, what=f"resuming request #{request.pk}")
    request.paused = False
    return request
