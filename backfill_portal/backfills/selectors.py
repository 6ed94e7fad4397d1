from __future__ import annotations

from django.db.models import Count, Q, QuerySet

from backfill_portal.backfills.choices import IntervalStatus
from backfill_portal.backfills.models import BackfillRequest, Interval


def request_list(*, user=None, mine: bool = False) -> QuerySet[BackfillRequest]:
    qs = BackfillRequest.objects.select_related("job__dataset", "requested_by", "code_version")
    if mine and user is not None:
        qs = qs.filter(requested_by=user)
    return qs


def request_progress(request: BackfillRequest) -> dict[str, int]:
    """Interval counts by status, from one aggregate query."""
    agg = Interval.objects.filter(request=request).aggregate(
        total=Count("id"),
        **{s: Count("id", filter=Q(status=s)) for s in IntervalStatus.values},
    )
    return agg


def request_intervals(request: BackfillRequest) -> QuerySet[Interval]:
    return Interval.objects.filter(request=request).select_related("job").order_by("job_id", "position")
