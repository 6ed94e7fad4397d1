"""Allowed edges of the request and interval lifecycles. No other code assigns `.status`."""
from __future__ import annotations

from collections.abc import Callable, Sequence

from django.db import transaction
from django.utils import timezone

from backfill_portal.backfills.choices import IntervalStatus as I
from backfill_portal.backfills.choices import RequestStatus as R
from backfill_portal.backfills.choices import StepStatus as S
from backfill_portal.backfills.models import ApprovalStep, BackfillRequest, Interval
from backfill_portal.core.errors import ConflictError
from backfill_portal.core.services.audit import audit_record
from backfill_portal.core.transitions import apply_transition, apply_transitions

REQUEST_EDGES: dict[str, frozenset[str]] = {
    R.DRAFT: frozenset({R.PENDING_APPROVAL, R.CANCELLED}),
    R.PENDING_APPROVAL: frozenset({R.APPROVED, R.REJECTED, R.CANCELLED}),
    R.APPROVED: frozenset({R.RUNNING, R.CANCELLED}),
    R.RUNNING: frozenset({R.RECONCILING, R.FAILED, R.CANCELLED}),
    R.RECONCILING: frozenset({R.COMPLETED, R.RUNNING, R.FAILED, R.ROLLED_BACK}),
    # Retried, rolled back, or given up (cancelled with a reason): a failed request that
    # published some partitions and cannot be retried into success must still end.
    R.FAILED: frozenset({R.RUNNING, R.ROLLED_BACK, R.CANCELLED}),
    # Reopened when an input of what it published is rolled back later (rollback.py).
    R.COMPLETED: frozenset({R.RECONCILING, R.ROLLED_BACK}),
    R.REJECTED: frozenset(),
    R.CANCELLED: frozenset(),
    R.ROLLED_BACK: frozenset(),
}
REQUEST_TERMINAL = frozenset({R.COMPLETED, R.REJECTED, R.CANCELLED, R.ROLLED_BACK})
REQUEST_ACTIVE = frozenset({R.PENDING_APPROVAL, R.APPROVED, R.RUNNING, R.RECONCILING})

INTERVAL_EDGES: dict[str, frozenset[str]] = {
    I.PLANNED: frozenset({I.QUEUED, I.SKIPPED, I.CANCELLED}),
    I.QUEUED: frozenset({I.RUNNING, I.PLANNED, I.CANCELLED, I.FAILED}),
    I.RUNNING: frozenset({I.PUBLISHED, I.FAILED, I.CANCELLED, I.QUEUED}),
    I.FAILED: frozenset({I.QUEUED, I.CANCELLED}),
    I.PUBLISHED: frozenset(),
    I.SKIPPED: frozenset(),
    I.CANCELLED: frozenset(),
}
INTERVAL_OPEN = frozenset({I.PLANNED, I.QUEUED, I.RUNNING, I.FAILED})

STEP_EDGES: dict[str, frozenset[str]] = {
    S.PENDING: frozenset({S.APPROVED, S.REJECTED, S.CANCELLED}),
    S.APPROVED: frozenset(),
    S.REJECTED: frozenset(),
    S.CANCELLED: frozenset(),
}


def request_transition(request: BackfillRequest, *, to: str, actor, reason: str = "", updates: dict | None = None,
                       data: dict | None = None, action: str | None = None) -> BackfillRequest:
    updates = dict(updates or {})
    if to in REQUEST_TERMINAL:
        if "finished_at" not in updates:
            updates["finished_at"] = timezone.now()
        # Pause means "dispatch nothing new for now": an ended request has nothing to
        # resume, so it must not stay paused (it would read "cancelled, paused").
        updates["paused"] = False
        if request.paused:
            data = {**(data or {}), "was_paused": True}
    return apply_transition(
        instance=request, to=to, edges=REQUEST_EDGES, actor=actor, object_type="request",
        request_id=request.pk, dataset=request.job.dataset.name, reason=reason,
        updates=updates, data=data, action=action,
    )


def interval_transition(interval: Interval, *, to: str, actor=None, reason: str = "", data: dict | None = None,
                        dataset: str | None = None) -> Interval:
    """`dataset`: the name of the interval's dataset where the caller has it at hand (its
    run's, on the worker's path); otherwise it is read through the interval's job."""
    return apply_transition(
        instance=interval, to=to, edges=INTERVAL_EDGES, actor=actor, object_type="interval",
        request_id=interval.request_id, dataset=interval.job.dataset.name if dataset is None else dataset,
        reason=reason, data={"partition": interval.partition_key, **(data or {})},
    )


def intervals_transition(intervals: Sequence[Interval], *, to: str, data: Callable[[Interval], dict],
                         dataset: Callable[[Interval], str]) -> None:
    """`interval_transition` (by the system) of several intervals in one state, as one
    conditional UPDATE, each with its own audit row. All or nothing: ConflictError if
    any moved on, and the caller's savepoint rolls the set back. `dataset(interval)`:
    its dataset's name, from what the caller has loaded."""
    apply_transitions(
        instances=intervals, to=to, edges=INTERVAL_EDGES, actor=None, object_type="interval",
        audit=lambda interval: {"request_id": interval.request_id, "dataset": dataset(interval),
                                "data": {"partition": interval.partition_key, **data(interval)}},
    )


def step_transition(step: ApprovalStep, *, to: str, actor, comment: str = "") -> ApprovalStep:
    return apply_transition(
        instance=step, to=to, edges=STEP_EDGES, actor=actor, object_type="approval_step",
        request_id=step.request_id, dataset=step.dataset.name if step.dataset_id else "",
        reason=comment, updates={"decided_by": actor if to != S.CANCELLED else None,
                                 "decided_at": timezone.now(), "comment": comment},
        data={"kind": step.kind},
    )


def intervals_bulk_transition(request: BackfillRequest, *, frm: str, to: str, actor=None, reason: str = "",
                              keep=()) -> int:
    """Move every interval of a request in state `frm` to `to` (but those whose ids are
    in `keep`) with one conditional update and one audit row carrying the count
    (thousands of rows, one decision)."""
    if to not in INTERVAL_EDGES.get(frm, ()):
        raise ConflictError(f"intervals cannot go from {frm} to {to}", field="status")
    with transaction.atomic():
        count = Interval.objects.filter(request=request, status=frm).exclude(pk__in=list(keep)).update(status=to)
        if count:
            audit_record(actor=actor, action=f"interval.{to}", object_type="request", object_id=request.pk,
                         request_id=request.pk, dataset=request.job.dataset.name, from_state=frm, to_state=to,
                         reason=reason, data={"intervals": count})
    return count
