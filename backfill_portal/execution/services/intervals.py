"""What a run's end means for its interval: the one place execution moves an interval
to failed (by backfills' interval transition) and asks for the request's next dispatch.
Running (runs.py) and verification (verify.py) both end runs this way."""
from __future__ import annotations

from backfill_portal.backfills.choices import IntervalStatus as I
from backfill_portal.backfills.transitions import interval_transition
from backfill_portal.execution.models import Run
from backfill_portal.execution.queue import enqueue


def interval_fail_with_run(run: Run) -> None:
    """Inside the caller's transaction: the run failed for good, so its interval fails
    (unless it already moved on) and the request is dispatched again, which queues the
    next interval or finds the request done."""
    if run.interval_id:
        interval = run.interval
        interval.refresh_from_db(fields=["status"])
        if interval.status in (I.QUEUED, I.RUNNING):
            interval_transition(interval, to=I.FAILED, reason=run.error[:500], data={"run_id": run.run_id},
                                dataset=run.job.dataset.name)
        enqueue("execution.dispatch_request", run.request_id, headers={"request_id": run.request_id})
