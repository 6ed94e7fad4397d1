"""The plan a request would freeze, read without writing anything: for the form's htmx
preview and `POST /api/requests/preview/`. It uses the functions creation uses
(plan_intervals, stale_later, plan_cascade, approval_plan), so the preview shows what
submission will ask for, including the stale later partitions of depends_on_past
datasets that the requester may exclude."""
from __future__ import annotations

from dataclasses import dataclass, field

from django.conf import settings
from django.utils import timezone

from backfill_portal.backfills.choices import Cascade
from backfill_portal.backfills.models import BackfillRequest
from backfill_portal.catalog.calendar import PlannedInterval, plan_intervals
from backfill_portal.backfills.services.requests import (
    CascadeNode,
    NodeAction,
    PlannedStep,
    approval_plan,
    not_ended,
    plan_cascade,
    unauthorised_target,
    unknown_cascade,
)
from backfill_portal.backfills.staleness import FIELD as STALE_FIELD
from backfill_portal.backfills.staleness import StaleLater, check_exclusions, stale_later
from backfill_portal.backfills.transitions import REQUEST_ACTIVE
from backfill_portal.catalog.models import Job
from backfill_portal.core.errors import ValidationError


@dataclass
class PlanPreview:
    job: Job
    planned: list[PlannedInterval]  # the target's intervals, stale later ones included
    downstream: list[CascadeNode]
    stale: list[StaleLater]
    total: int
    steps: list[PlannedStep] = field(default_factory=list)
    overlaps: list[BackfillRequest] = field(default_factory=list)


def overlapping_active(job: Job, start, end, *, exclude_pk=None, limit: int = 20) -> list[BackfillRequest]:
    """Active requests on the job whose UTC span overlaps [start, end) (plans are contiguous)."""
    qs = (BackfillRequest.objects.select_related("requested_by")
          .filter(job=job, status__in=REQUEST_ACTIVE, range_start__lt=end, range_end__gt=start).order_by("pk"))
    if exclude_pk is not None:
        qs = qs.exclude(pk=exclude_pk)
    return list(qs[:limit])


def request_plan_preview(*, user, job: Job, start, end, side_effects: list[str] = (), cascade: str = Cascade.NONE,
                    exclude_stale: dict[str, list[str]] | None = None) -> PlanPreview:
    """The plan for `job` over first..last partition `start`..`end`. Bad input raises
    ValidationError naming the field, as creation would."""
    if problem := unknown_cascade(cascade):
        raise ValidationError(problem, field="cascade")
    if problem := unauthorised_target(job, side_effects):
        raise ValidationError(problem, field="side_effects")
    ds = job.dataset
    planned = plan_intervals(grain=ds.grain, timezone=ds.timezone, first=start, last=end,
                             limit=settings.BACKFILL_MAX_INTERVALS)
    now = timezone.now()
    if unended := not_ended(job=job, planned=planned, now=now):
        raise ValidationError(unended[0], fields={"end": unended})
    exclude_stale = exclude_stale or {}
    effects = list(Job.objects.select_related("dataset__owner").filter(name__in=list(side_effects or [])))
    known = {j.name: j for j in effects}
    bad = [f"job {name!r} does not exist" if name not in known else f"{name} is not a side-effect node"
           for name in side_effects or [] if name not in known or not known[name].has_side_effects]
    if bad:
        raise ValidationError(bad[0], fields={"side_effects": bad})
    stale: list[StaleLater] = []
    if job.depends_on_past:
        root = stale_later(job=job, after=planned[-1], exclude=exclude_stale.get(job.name, ()))
        stale.append(root)
        planned = planned + root.included
    downstream: list[CascadeNode] = []
    if cascade in (Cascade.CASCADE, Cascade.HANDOFF):
        downstream = plan_cascade(job=job, cascade=cascade, start=planned[0].start, end=planned[-1].end,
                                  authorised=set(known), overrides={}, exclude_stale=exclude_stale)
        if unended := not_ended(job=job, planned=[], downstream=downstream, now=now):
            raise ValidationError(unended[0], fields={"end": unended})
        stale += [n.stale for n in downstream if n.stale is not None]
    unplanned = check_exclusions(exclude_stale, {s.job.name: s for s in stale})
    if unplanned:
        raise ValidationError(unplanned[0], fields={STALE_FIELD: unplanned})
    total = len(planned) + sum(len(n.partitions) for n in downstream if n.action != NodeAction.HANDOFF)
    if total > settings.BACKFILL_MAX_INTERVALS:
        raise ValidationError(f"with its cascade this range has {total} intervals; "
                              f"the limit is {settings.BACKFILL_MAX_INTERVALS}", field="end")
    steps = approval_plan(requester_id=user.pk, job=job, side_effects=effects, interval_count=total,
                          rebuilt=[n.job for n in downstream if n.action == NodeAction.REBUILD])
    return PlanPreview(job=job, planned=planned, downstream=downstream,
                       stale=[s for s in stale if s.included or s.excluded], total=total, steps=steps,
                       overlaps=overlapping_active(job, planned[0].start, planned[-1].end))
