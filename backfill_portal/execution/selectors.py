"""Reads of runs that services and pages share."""
from __future__ import annotations

from django.db.models import QuerySet

from backfill_portal.execution.choices import RunType
from backfill_portal.execution.models import Run


def run_list() -> QuerySet[Run]:
    return Run.objects.select_related("job__dataset", "code_version", "request")


def run_get(run_id: str) -> Run | None:
    # run_id is unique: no ORDER BY (the model's default ordering is cleared), and only
    # the relations every task reads. Each join multiplies PostgreSQL's planning time,
    # and every task of every interval makes this call.
    return next(iter(Run.objects.select_related("job__dataset", "code_version", "request", "interval")
                     .filter(run_id=run_id).order_by()), None)


def verification_original(verification: Run) -> Run | None:
    """The backfill run a verification run recomputes: the latest one of the same
    interval created before it (a retry of the interval creates a new original later)."""
    return (Run.objects.select_related("job__dataset", "request", "interval")
            .filter(interval_id=verification.interval_id, run_type=RunType.BACKFILL, pk__lt=verification.pk)
            .order_by("-pk").first())
