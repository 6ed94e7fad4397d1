"""Allowed edges of the run and attempt lifecycles. No other code assigns `.status`."""
from __future__ import annotations

from contextlib import nullcontext

from django.db import transaction

from backfill_portal.core.transitions import apply_transition
from backfill_portal.execution.choices import AttemptStatus as A
from backfill_portal.execution.choices import RunStatus as R
from backfill_portal.execution.lineage_out.events import Transition
from backfill_portal.execution.lineage_out.outbox import lineage_transition
from backfill_portal.execution.models import Attempt, Run

RUN_EDGES: dict[str, frozenset[str]] = {
    R.QUEUED: frozenset({R.RUNNING, R.CANCELLED}),
    R.RUNNING: frozenset({R.STAGED, R.FAILED, R.CANCELLED, R.QUEUED}),
    R.STAGED: frozenset({R.VERIFYING, R.CANCELLED, R.FAILED}),
    R.VERIFYING: frozenset({R.VERIFIED, R.VERIFICATION_FAILED, R.CANCELLED, R.STAGED}),
    R.VERIFIED: frozenset({R.PUBLISHED, R.CANCELLED, R.FAILED}),
    R.PUBLISHED: frozenset({R.SUPERSEDED, R.ROLLED_BACK}),
    R.FAILED: frozenset({R.QUEUED, R.CANCELLED}),
    R.VERIFICATION_FAILED: frozenset(),
    R.CANCELLED: frozenset(),
    R.SUPERSEDED: frozenset({R.PUBLISHED}),
    R.ROLLED_BACK: frozenset({R.PUBLISHED}),
}
RUN_TERMINAL = frozenset({R.PUBLISHED, R.VERIFICATION_FAILED, R.CANCELLED, R.SUPERSEDED, R.ROLLED_BACK})
RUN_ACTIVE = frozenset({R.QUEUED, R.RUNNING, R.STAGED, R.VERIFYING, R.VERIFIED})

ATTEMPT_EDGES: dict[str, frozenset[str]] = {
    A.RUNNING: frozenset({A.SUCCEEDED, A.FAILED, A.LOST}),
    A.SUCCEEDED: frozenset(),
    A.FAILED: frozenset(),
    A.LOST: frozenset(),
}


def run_transition(run: Run, *, to: str, actor=None, reason: str = "", updates: dict | None = None,
                   data: dict | None = None, expect: dict | None = None) -> Run:
    """Its OpenLineage event (if the edge emits one, and lineage is on) is written in the
    same transaction as the state and its audit row, and sent after commit."""
    before = run.status
    # Inside the caller's transaction as it is (no savepoint, and a lost race raised by
    # apply_transition leaves that transaction usable); alone, one transaction of its own.
    with nullcontext() if transaction.get_connection().in_atomic_block else transaction.atomic():
        apply_transition(
            instance=run, to=to, edges=RUN_EDGES, actor=actor, object_type="run", request_id=run.request_id,
            dataset=run.job.dataset.name, reason=reason, updates=updates, expect=expect,
            data={"run_id": run.run_id, "partition": run.partition_key, **(data or {})},
        )
        lineage_transition(run, Transition(before=before, to=to, actor=actor, reason=reason, data=data or {}))
    return run


def attempt_transition(attempt: Attempt, *, to: str, actor=None, reason: str = "", updates: dict | None = None) -> Attempt:
    return apply_transition(
        instance=attempt, to=to, edges=ATTEMPT_EDGES, actor=actor, object_type="attempt",
        request_id=attempt.run.request_id, reason=reason, updates=updates,
        data={"run_id": attempt.run.run_id, "attempt_no": attempt.attempt_no},
    )
