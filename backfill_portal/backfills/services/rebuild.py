"""A request over an explicit set of (job, partition): the rebuild of a rollback's
contaminated closure.

A range request plans every partition from first to last and, when it cascades, the
whole lineage below; a closure is neither contiguous nor the whole lineage (dws
2022-10-02, ads 2022-10-02, then the cumulative dataset from 2022-10-02 on). The
request model already freezes its plan as Interval rows per job, so this draft is the
same request with exactly those rows: the root is the closure's job first in
topological order, every other job is a cascade node (`node_actions`), dispatch
runs them layer by layer on what the request published upstream, and submission
generates the usual approval steps from it (one per owner of a rebuilt dataset).
Side-effect nodes are skipped (recorded per interval) unless authorised.
"""
from __future__ import annotations

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from backfill_portal.backfills.choices import Cascade, RequestStatus
from backfill_portal.backfills.models import BackfillRequest, Interval
from backfill_portal.catalog.calendar import interval_for_key
from backfill_portal.backfills.services.requests import NodeAction
from backfill_portal.catalog.lineage import LineageGraph
from backfill_portal.catalog.models import Job
from backfill_portal.core.errors import ValidationError
from backfill_portal.core.roles import Role, require_role
from backfill_portal.core.services.audit import audit_record

SKIPPED_EFFECT = "skipped: side-effect node not authorised"


def backfill_request_create_partitions(*, actor, partitions: dict[str, list[str]], reason: str,
                                       parent: BackfillRequest | None = None,
                                       side_effects: tuple[str, ...] = ()) -> BackfillRequest:
    """Create a draft that rebuilds exactly `partitions` ({job: [partition keys]}).

    1. Check the role, the jobs, the keys and the size; write nothing on any error.
    2. Order the jobs topologically: the first is the request's job, the others are
       cascade nodes (rebuild, or skip for an unauthorised side-effect node).
    3. Request, intervals and the audit row in one transaction.
    """
    require_role(actor, Role.REQUESTER, Role.OWNER, Role.ONCALL, Role.ADMIN, action="request.create")
    reason = (reason or "").strip()
    if not reason:
        raise ValidationError("say why this backfill is needed; auditors will read it", field="reason")
    wanted = {name: sorted(set(keys)) for name, keys in partitions.items() if keys}
    if not wanted:
        raise ValidationError("no partition to rebuild", field="partitions")
    jobs = {j.name: j for j in Job.objects.filter(name__in=list(wanted)).select_related("dataset__owner")}
    errors = [f"job {name!r} does not exist" for name in wanted if name not in jobs]
    errors += [f"{name} produces a source; sources are not rebuilt" for name, j in jobs.items() if j.dataset.is_source]
    if errors:
        raise ValidationError("; ".join(errors), fields={"partitions": errors})
    planned: dict[str, list] = {}
    for name, keys in wanted.items():
        ds = jobs[name].dataset
        planned[name] = sorted((interval_for_key(grain=ds.grain, timezone=ds.timezone, partition_key=k) for k in keys),
                               key=lambda p: p.start)
    total = sum(len(p) for p in planned.values())
    if total > settings.BACKFILL_MAX_INTERVALS:
        raise ValidationError(f"this rebuild has {total} intervals; the limit is {settings.BACKFILL_MAX_INTERVALS}",
                              field="partitions")
    order = LineageGraph.cached().topo_index
    names = sorted(wanted, key=lambda n: (order.get(n, len(order)), n))
    root = jobs[names[0]]
    authorised = set(side_effects)
    node_actions = {n: NodeAction.SKIP if jobs[n].has_side_effects and n not in authorised
                    else NodeAction.REBUILD for n in names[1:]}
    root_plan = planned[root.name]
    with transaction.atomic():
        request = BackfillRequest.objects.create(
            job=root, requested_by=actor, requested_at=timezone.now(), reason=reason,
            first_partition=root_plan[0].partition_key, last_partition=root_plan[-1].partition_key,
            range_start=root_plan[0].start, range_end=root_plan[-1].end, interval_count=len(root_plan),
            cascade=Cascade.CASCADE if len(names) > 1 else Cascade.NONE, node_actions=node_actions, parent=parent,
        )
        effects = [jobs[n] for n in names if jobs[n].has_side_effects and n in authorised]
        if effects:
            request.side_effects.set(effects)
        Interval.objects.bulk_create([
            Interval(request=request, job=jobs[name], position=i, partition_key=p.partition_key, start=p.start,
                     end=p.end, note=SKIPPED_EFFECT if node_actions.get(name) == NodeAction.SKIP else "")
            for name in names for i, p in enumerate(planned[name])], batch_size=2000)
        audit_record(actor=actor, action="request.create", object_type="request", object_id=request.pk,
                     request_id=request.pk, dataset=root.dataset.name, to_state=RequestStatus.DRAFT, reason=reason,
                     data={"partitions": {n: [p.partition_key for p in planned[n]] for n in names},
                           "intervals": total, "parent": parent.pk if parent else None,
                           "cascade_plan": node_actions})
    return request


__all__ = ["backfill_request_create_partitions"]
