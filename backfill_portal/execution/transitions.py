"""Allowed edges of the run and attempt lifecycles. No other code assigns `.status`."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext

from django.db import transaction
from django.db.models import Exists

from backfill_portal.core.services.audit import audit_serialise
from backfill_portal.core.transitions import apply_transition, apply_transitions
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
# A run in one of these is failing (Run.failing) until a later run of its job and
# partition is published; one of RUN_WAS_PUBLISHED has been published at some point.
RUN_FAILED = frozenset({R.FAILED, R.VERIFICATION_FAILED})
RUN_WAS_PUBLISHED = frozenset({R.PUBLISHED, R.SUPERSEDED, R.ROLLED_BACK})

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
    updates = dict(updates or {})
    if to in RUN_FAILED:
        updates["failing"] = True  # unless a later run was published: run_failing_keep below
    elif before in RUN_FAILED:
        updates["failing"] = False  # retried or cancelled: no longer a failure that stands
    # Inside the caller's transaction as it is (no savepoint, and a lost race raised by
    # apply_transition leaves that transaction usable); alone, one transaction of its own.
    with nullcontext() if transaction.get_connection().in_atomic_block else transaction.atomic():
        apply_transition(
            instance=run, to=to, edges=RUN_EDGES, actor=actor, object_type="run", request_id=run.request_id,
            dataset=run.job.dataset.name, reason=reason, updates=updates, expect=expect,
            data={"run_id": run.run_id, "partition": run.partition_key, **(data or {})},
        )
        if to in RUN_FAILED or to == R.PUBLISHED:
            audit_serialise()  # the audit chain's lock, before the read (below)
        if to in RUN_FAILED:
            run_failing_keep(run)
        elif to == R.PUBLISHED:
            runs_failing_clear(run)
        lineage_transition(run, Transition(before=before, to=to, actor=actor, reason=reason, data=data or {}))
    return run


def runs_transition(runs: Sequence[Run], *, to: str, updates: dict | None = None,
                    data: Callable[[Run], dict] | None = None, expect: Callable[[Run], dict] | None = None,
                    reason: Callable[[Run], str] | None = None) -> None:
    """`run_transition` (by the system) of several runs in one state, as one conditional
    UPDATE (core.transitions.apply_transitions): each run gets the audit row, failing
    flag and lineage event it would get alone. All or nothing: ConflictError if any run
    moved on, and the caller's savepoint rolls the set back. `updates` values may be
    callables (each run's own value); `data(run)`, `reason(run)`: its audit data and reason."""
    if not runs:
        return
    before = runs[0].status
    updates = dict(updates or {})
    if to in RUN_FAILED:
        updates["failing"] = True
    elif before in RUN_FAILED:
        updates["failing"] = False
    data = data or (lambda run: {})
    reason = reason or (lambda run: "")
    with nullcontext() if transaction.get_connection().in_atomic_block else transaction.atomic():
        apply_transitions(
            instances=runs, to=to, edges=RUN_EDGES, actor=None, object_type="run", updates=updates, expect=expect,
            audit=lambda run: {"request_id": run.request_id, "dataset": run.job.dataset.name, "reason": reason(run),
                               "data": {"run_id": run.run_id, "partition": run.partition_key, **data(run)}},
        )
        if to in RUN_FAILED or to == R.PUBLISHED:
            audit_serialise()
        if to in RUN_FAILED:
            for run in runs:
                run_failing_keep(run)
        elif to == R.PUBLISHED:
            _failing_clear(runs)
        for run in runs:
            lineage_transition(run, Transition(before=before, to=to, actor=None, reason=reason(run), data=data(run)))


def attempts_transition(attempts: Sequence[Attempt], *, to: str, updates: dict | None = None) -> None:
    """`attempt_transition` (by the system) of several attempts in one state, all or
    nothing, as `runs_transition`."""
    apply_transitions(
        instances=attempts, to=to, edges=ATTEMPT_EDGES, actor=None, object_type="attempt", updates=updates,
        audit=lambda attempt: {"request_id": attempt.run.request_id,
                               "data": {"run_id": attempt.run.run_id, "attempt_no": attempt.attempt_no}},
    )


# --- Run.failing: "failed, and no later run of its partition published since" ----------------
#
# Kept here, in the transaction of the transition that changes it, so the runs list and
# the on-call home read failing runs by the (failing, id) index instead of probing every
# failed run's partition. A publication clears it for good: a rollback of the repairing
# run does not bring the old failure back (the partition was repaired; what the rollback
# restored is on the home page's rollbacks panel).
#
# Each side reads after taking the audit chain's lock, held until commit (PostgreSQL:
# an advisory lock; SQLite: one writer at a time): writing its transition's audit row
# takes it, or, when the events wait in an audit batch, `audit_serialise`. So a failure
# and a concurrent publication of a later run of the same partition never both miss
# each other: the second to take the lock sees the first.


def run_failing_keep(run: Run) -> None:
    """`run` has just failed (its claim set failing): clear it again if a later run of
    its job and partition has been published (runs may finish out of order)."""
    later = Run.objects.filter(job_id=run.job_id, partition_key=run.partition_key, pk__gt=run.pk,
                               status__in=RUN_WAS_PUBLISHED)
    if Run.objects.filter(pk=run.pk).filter(Exists(later)).update(failing=False):
        run.failing = False


def runs_failing_clear(run: Run) -> None:
    """`run` has just been published: earlier failures of its partition are repaired."""
    _failing_clear([run])


def _failing_clear(runs: Sequence[Run]) -> None:
    """Clear the flag of the failing runs of the runs' jobs and partitions that are
    older than the run published there. The failing runs are few: they are read by the
    (failing, id) index and matched here, rather than by a condition of one OR per run
    (a bundle publishes sixteen), whose compilation cost more than the statement."""
    newest: dict[tuple[int, str], int] = {}
    for run in runs:
        key = (run.job_id, run.partition_key)
        newest[key] = max(newest.get(key, 0), run.pk)
    failing = Run.objects.filter(failing=True, job_id__in={job_id for job_id, _ in newest},
                                 partition_key__in={key for _, key in newest})
    earlier = [pk for pk, job_id, key in failing.values_list("pk", "job_id", "partition_key")
               if pk < newest.get((job_id, key), 0)]
    if earlier:
        Run.objects.filter(pk__in=earlier, failing=True).update(failing=False)


def attempt_transition(attempt: Attempt, *, to: str, actor=None, reason: str = "", updates: dict | None = None) -> Attempt:
    return apply_transition(
        instance=attempt, to=to, edges=ATTEMPT_EDGES, actor=actor, object_type="attempt",
        request_id=attempt.run.request_id, dataset=attempt.run.job.dataset.name, reason=reason, updates=updates,
        data={"run_id": attempt.run.run_id, "attempt_no": attempt.attempt_no},
    )
