"""Backfill request lifecycle: create a draft, submit (freeze), approve, reject, cancel,
and start once approved. What follows (failed, reconciling, completed, reopened,
rolled back, paused) is in lifecycle.py."""
from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from backfill_portal.backfills import approval_rules, policy
from backfill_portal.backfills.approval_rules import PlannedStep
from backfill_portal.backfills.choices import Cascade, IntervalStatus, RequestStatus, StepStatus, Strategy
from backfill_portal.backfills.models import MAX_ACTIVE_INTERVALS_LIMIT, ApprovalStep, BackfillRequest, Interval
from backfill_portal.backfills.selectors import request_get
from backfill_portal.catalog.calendar import PlannedInterval, first_unended, plan_intervals
from backfill_portal.backfills.services.notifications import notify_approvers
from backfill_portal.backfills.services.run_control import run_control
from backfill_portal.backfills.staleness import FIELD as STALE_FIELD
from backfill_portal.backfills.staleness import (
    StaleLater,
    check_exclusions,
    gap_before,
    published_after,
    stale_later,
)
from backfill_portal.backfills.transitions import (
    REQUEST_ACTIVE,
    intervals_bulk_transition,
    request_transition,
    step_transition,
)
from backfill_portal.catalog.kinds import kind_unavailable
from backfill_portal.catalog.lineage import LineageGraph, covered_partitions
from backfill_portal.catalog.models import Dataset, Job
from backfill_portal.core.errors import ConflictError, ValidationError
from backfill_portal.core.outbox import enqueue
from backfill_portal.core.retry import run_again_if_deadlocked
from backfill_portal.core.services.audit import audit_record, audit_serialise


def _payload_hash(payload: dict) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def unknown_cascade(cascade: str) -> str | None:
    """Why `cascade` is refused (creation and the preview alike), or None."""
    return None if cascade in Cascade.values else f"{cascade!r} is not one of {', '.join(Cascade.values)}"


def unauthorised_target(job: Job, side_effects: Iterable[str] | None) -> str | None:
    """Why a request for `job` with these authorisations is refused, or None: planned
    unauthorised, a side-effect node as the target would be skipped whole after the
    approvals."""
    if job.has_side_effects and job.name not in (side_effects or ()):
        return f"{job.name} is a side-effect node: authorise it in side_effects to back-fill it (its owner approves that)"
    return None


def backfill_request_create(
    *,
    actor,
    job: str,
    start,
    end,
    reason: str,
    cascade: str = Cascade.NONE,
    strategy: str = Strategy.FORWARD,
    max_active_intervals: int = 4,
    side_effects: list[str] | tuple[str, ...] = (),
    verify_twice: bool = False,
    idempotency_key: str | None = None,
    node_actions: dict[str, str] | None = None,
    exclude_stale: dict[str, list[str]] | None = None,
) -> tuple[BackfillRequest, bool]:
    """Create a draft with its planned intervals. Returns (request, created).

    1. Check the role and every field; collect field errors, write nothing on any.
    2. The same idempotency key from the same user returns the same request
       (a different payload under a reused key is a conflict).
    3. Plan the intervals in the dataset's timezone; every one (and every one a cascade
       rebuilds) must have ended. A depends_on_past job's published
       partitions after the last planned one are stale (each read the one before):
       they join the plan, in order, except those named in `exclude_stale`
       ({job: [partition]}); the same holds for every depends_on_past node a cascade
       rebuilds, and its downstream follows the longer span.
    4. Persist request + intervals + audit row (with the exclusions) in one transaction.
    """
    policy.require_create(actor)
    errors: dict[str, list[str]] = {}
    job_obj = Job.objects.select_related("dataset", "current_code_version").filter(name=job).first()
    if job_obj is None:
        source = Dataset.objects.filter(name=str(job), is_source=True).exists()
        errors.setdefault("job", []).append(
            f"{job!r} is a source dataset: it is read as it arrives, no job produces it, so it is not backfilled"
            if source else f"job {job!r} does not exist")
    elif job_obj.dataset.is_source:
        errors.setdefault("job", []).append(f"{job} reads a source; sources are not backfilled")
    elif why := kind_unavailable(job_obj.kind):
        errors.setdefault("job", []).append(f"{job} is a {job_obj.kind} job: {why}")
    reason = (reason or "").strip()
    if not reason:
        errors.setdefault("reason", []).append("say why this backfill is needed; auditors will read it")
    if problem := unknown_cascade(cascade):
        errors.setdefault("cascade", []).append(problem)
    if strategy not in Strategy.values:
        errors.setdefault("strategy", []).append(f"{strategy!r} is not one of {', '.join(Strategy.values)}")
    elif strategy != Strategy.FORWARD and job_obj is not None and job_obj.depends_on_past:
        # Each partition reads the one before: they run oldest first whatever is asked,
        # and the request page would show an order that never happened.
        errors.setdefault("strategy", []).append(
            f"{job_obj.name} depends on its past: its partitions run oldest first, so the strategy is forward")
    if not isinstance(max_active_intervals, int) or not 1 <= max_active_intervals <= MAX_ACTIVE_INTERVALS_LIMIT:
        errors.setdefault("max_active_intervals", []).append(f"must be a whole number from 1 to {MAX_ACTIVE_INTERVALS_LIMIT}")
    effect_jobs = list(Job.objects.filter(name__in=list(side_effects or [])))
    known = {j.name: j for j in effect_jobs}
    for name in side_effects or []:
        if name not in known:
            errors.setdefault("side_effects", []).append(f"job {name!r} does not exist")
        elif not known[name].has_side_effects:
            errors.setdefault("side_effects", []).append(f"{name} is not a side-effect node; only those need authorising")
    if job_obj is not None and (problem := unauthorised_target(job_obj, side_effects)):
        errors.setdefault("side_effects", []).append(problem)
    if idempotency_key is not None and not (1 <= len(str(idempotency_key)) <= 128):
        errors.setdefault("idempotency_key", []).append("must be 1 to 128 characters")
    exclude_stale = exclude_stale or {}
    if not isinstance(exclude_stale, dict) or not all(
            isinstance(keys, (list, tuple)) and all(isinstance(k, str) for k in keys) for keys in exclude_stale.values()):
        errors.setdefault(STALE_FIELD, []).append("must map a job name to a list of partition keys")
        exclude_stale = {}

    payload = {
        "job": job, "start": str(start), "end": str(end), "reason": reason, "cascade": cascade,
        "strategy": strategy, "max_active_intervals": max_active_intervals,
        "side_effects": sorted(side_effects or []), "verify_twice": bool(verify_twice),
        "node_actions": dict(sorted((node_actions or {}).items())),
    }
    if exclude_stale:  # only when given, so earlier requests' payload hashes still match
        payload["exclude_stale"] = {name: sorted(keys) for name, keys in sorted(exclude_stale.items())}
    digest = _payload_hash(payload)
    reused = None  # the key's request when the parameters differ: a 409, once they are known to be valid
    if idempotency_key and not errors:
        existing = BackfillRequest.objects.filter(requested_by=actor, idempotency_key=idempotency_key).first()
        if existing is not None and existing.payload_hash == digest:
            return existing, False  # a replay: the same request, nothing planned again
        reused = existing

    planned = []
    now = timezone.now()
    if job_obj is not None and not errors.get("job"):
        try:
            planned = plan_intervals(
                grain=job_obj.dataset.grain, timezone=job_obj.dataset.timezone,
                first=start, last=end, limit=settings.BACKFILL_MAX_INTERVALS,
            )
        except ValidationError as exc:
            for key, messages in exc.fields.items():
                errors.setdefault(key, []).extend(messages)
            if not exc.fields:
                errors.setdefault("start", []).append(exc.message)
        if unended := not_ended(job=job_obj, planned=planned, now=now):
            errors.setdefault("end", []).extend(unended)
    if planned and not errors and (gap := gap_before(job=job_obj, first=planned[0])):
        errors.setdefault("start", []).append(gap)
    stale: dict[str, StaleLater] = {}
    if planned and not errors and job_obj.depends_on_past:
        try:
            stale[job_obj.name] = stale_later(job=job_obj, after=planned[-1], exclude=exclude_stale.get(job_obj.name, ()))
        except ValidationError as exc:
            errors.setdefault(STALE_FIELD, []).extend(exc.fields.get(STALE_FIELD, [exc.message]))
        else:
            planned = planned + stale[job_obj.name].included
    cascade_plan: list[CascadeNode] = []
    if planned and not errors and cascade != Cascade.NONE:
        try:
            cascade_plan = plan_cascade(job=job_obj, cascade=cascade, start=planned[0].start, end=planned[-1].end,
                                        authorised={j.name for j in effect_jobs}, overrides=node_actions or {},
                                        exclude_stale=exclude_stale)
        except ValidationError as exc:
            for key, messages in exc.fields.items():
                errors.setdefault(key, []).extend(messages)
        if unended := not_ended(job=job_obj, planned=[], downstream=cascade_plan, now=now):
            errors.setdefault("end", []).extend(unended)
    elif node_actions:
        errors.setdefault("node_actions", []).append("node actions need cascade or handoff")
    if job_obj is not None and effect_jobs and not errors:
        # An authorisation for a node this request never runs would only add an approval
        # step its owner decides for nothing (and a hand-off's follow-up does not carry it).
        runs = {job_obj.name} | {n.job.name for n in cascade_plan if n.action == NodeAction.REBUILD}
        for effect in effect_jobs:
            if effect.name not in runs:
                errors.setdefault("side_effects", []).append(
                    f"{effect.name} is not run by this request (cascade {cascade}): authorise a side-effect node "
                    "only where the plan runs it")
    for node in cascade_plan:  # a depends_on_past node the cascade rebuilds: the same gap check
        if node.action == NodeAction.REBUILD and node.partitions and (
                gap := gap_before(job=node.job, first=node.partitions[0])):
            errors.setdefault("cascade", []).append(gap)
    stale.update({n.job.name: n.stale for n in cascade_plan if n.stale is not None})
    unplanned = check_exclusions(exclude_stale, stale) if planned and not errors else []
    if unplanned:
        errors[STALE_FIELD] = unplanned
    total = len(planned) + sum(len(n.partitions) for n in cascade_plan if n.action != NodeAction.HANDOFF)
    if planned and total > settings.BACKFILL_MAX_INTERVALS and not errors:
        n_stale = sum(len(s.included) for s in stale.values())
        errors.setdefault("end", []).append(
            f"with its cascade this range has {total} intervals; the limit is {settings.BACKFILL_MAX_INTERVALS}"
            + (f" ({n_stale} of them stale later partitions of depends_on_past datasets: exclude them "
               f"in {STALE_FIELD} or split the request)" if n_stale else ""))
    if errors:
        first_field, messages = next(iter(errors.items()))
        raise ValidationError(f"{first_field}: {messages[0]}", fields=errors)
    if reused is not None:  # bad input is a 400 first, even under a key already used
        _same_or_conflict(reused, digest)

    try:
        with transaction.atomic():
            request = BackfillRequest.objects.create(
                job=job_obj, requested_by=actor, requested_at=timezone.now(), reason=reason,
                first_partition=planned[0].partition_key, last_partition=planned[-1].partition_key,
                range_start=planned[0].start, range_end=planned[-1].end, interval_count=len(planned),
                cascade=cascade, strategy=strategy, max_active_intervals=max_active_intervals,
                verify_twice=bool(verify_twice), idempotency_key=idempotency_key or None, payload_hash=digest,
                node_actions={n.job.name: n.action for n in cascade_plan},
                # Every depends_on_past job checked, even with nothing stale: submission
                # checks them again (see _stale_since_draft).
                stale={name: s.as_dict() for name, s in stale.items()},
            )
            if effect_jobs:
                request.side_effects.set(effect_jobs)
            stale_keys = _stale_notes(stale.get(job_obj.name))
            Interval.objects.bulk_create(
                [
                    Interval(request=request, job=job_obj, position=i, partition_key=p.partition_key,
                             start=p.start, end=p.end,
                             note=stale_keys.get(p.partition_key) or getattr(p, "note", "") or "")
                    for i, p in enumerate(planned)
                ],
                batch_size=2000,
            )
            _persist_cascade(request, cascade_plan)
            audit_record(
                actor=actor, action="request.create", object_type="request", object_id=request.pk,
                request_id=request.pk, dataset=job_obj.dataset.name, to_state=RequestStatus.DRAFT, reason=reason,
                data={**payload, "intervals": len(planned), "first": request.first_partition,
                      "last": request.last_partition, "cascade_plan": request.node_actions,
                      **({"stale": request.stale} if request.stale else {})},
            )
    except IntegrityError:
        # Two concurrent creates with one key: the loser returns the winner's request.
        existing = BackfillRequest.objects.filter(requested_by=actor, idempotency_key=idempotency_key).first()
        if existing is None:
            raise
        return _same_or_conflict(existing, digest), False
    return request, True


class NodeAction:
    REBUILD = "rebuild"
    SKIP = "skip"
    HANDOFF = "handoff"
    ALL = (REBUILD, SKIP, HANDOFF)


@dataclass
class CascadeNode:
    job: Job
    layer: int
    action: str
    partitions: list  # PlannedInterval
    stale: StaleLater | None = field(default=None)  # depends_on_past: its later partitions (in `partitions`)


def not_ended(*, job: Job, planned: list[PlannedInterval], downstream: Iterable[CascadeNode] = (), now) -> list[str]:
    """Why the plan is refused for intervals that have not ended at `now` (empty: every
    one has). The scheduler never runs an interval before its end, and neither does a
    backfill: one of today (or later) would publish a partial partition that readers
    take for the whole. Checks the target's intervals and those of the downstream nodes
    a cascade rebuilds; names the first that has not ended and when it ends, in UTC."""
    messages = []
    iv = first_unended(planned, now=now)
    if iv is not None:
        messages.append(f"partition {iv.partition_key} of {job.name} has not ended yet: it ends at "
                        f"{iv.end:%Y-%m-%d %H:%M} UTC; backfill only intervals that have ended, or readers "
                        f"would see a partial {iv.grain}")
    for node in downstream:
        iv = first_unended(node.partitions, now=now) if node.action == NodeAction.REBUILD else None
        if iv is not None:
            messages.append(f"the cascade rebuilds partition {iv.partition_key} of {node.job.name}, which has not "
                            f"ended yet: it ends at {iv.end:%Y-%m-%d %H:%M} UTC; end the range earlier, or skip "
                            f"{node.job.name}")
            break
    return messages


def _stale_notes(stale: StaleLater | None) -> dict[str, str]:
    return {p.partition_key: stale.note[:200] for p in stale.included} if stale else {}


def plan_cascade(*, job: Job, cascade: str, start, end, authorised: set[str],
                 overrides: dict[str, str], exclude_stale: dict[str, list[str]] | None = None) -> list[CascadeNode]:
    """The downstream nodes of a cascade or hand-off, with the action for each.

    cascade: every downstream node is rebuilt after its upstreams publish, except
    side-effect nodes that were not authorised (skipped, recorded per interval) and
    nodes the requester chose to skip. handoff: downstream owners decide later.
    A rebuilt depends_on_past node also rebuilds its stale later partitions (minus
    `exclude_stale`), and the nodes below it follow that longer span.
    """
    try:
        nodes = LineageGraph.cached().closure(job.name)[1:]
    except ValueError as exc:
        raise ValidationError(str(exc), field="cascade") from None
    names = {n.job.name for n in nodes}
    errors = [f"{name} is not downstream of {job.name}" for name in overrides if name not in names]
    errors += [f"{name}: {action!r} is not one of {', '.join(NodeAction.ALL)}"
               for name, action in overrides.items() if action not in NodeAction.ALL]
    if errors:
        raise ValidationError("; ".join(errors), fields={"node_actions": errors})
    jobs = {j.name: j for j in Job.objects.filter(name__in=names).select_related("dataset__owner")}
    plan = []
    span_end = {job.name: end}  # how far each node's republished partitions reach
    for node in nodes:
        if cascade == Cascade.HANDOFF:
            action = NodeAction.HANDOFF
        elif node.is_side_effect and node.job.name not in authorised:
            action = NodeAction.SKIP
        else:
            action = NodeAction.REBUILD
        action = overrides.get(node.job.name, action)
        if node.is_side_effect and action == NodeAction.REBUILD and node.job.name not in authorised:
            raise ValidationError(f"{node.job.name} is a side-effect node: authorise it in side_effects to run it",
                                  field="side_effects")
        node_end = max((span_end[u] for u in node.upstream_jobs if u in span_end), default=end)
        partitions = covered_partitions(grain=node.job.grain, timezone=node.job.timezone, start=start, end=node_end)
        stale = None
        if node.job.depends_on_past and action == NodeAction.REBUILD and partitions:
            stale = stale_later(job=jobs[node.job.name], after=partitions[-1],
                                exclude=(exclude_stale or {}).get(node.job.name, ()))
            partitions = partitions + stale.included
            if stale.included:
                node_end = max(node_end, stale.included[-1].end)
        span_end[node.job.name] = node_end if action == NodeAction.REBUILD else end
        plan.append(CascadeNode(job=jobs[node.job.name], layer=node.layer, action=action, partitions=partitions,
                                stale=stale))
    return plan


def _persist_cascade(request: BackfillRequest, plan: list[CascadeNode]) -> None:
    """Downstream intervals go into the same frozen plan; skipped nodes are recorded
    per interval (with the reason) so the manifest can name them."""
    rows = []
    for node in plan:
        if node.action == NodeAction.HANDOFF:
            continue
        notes = _stale_notes(node.stale)
        rows += [Interval(request=request, job=node.job, position=i, partition_key=p.partition_key, start=p.start,
                          end=p.end, note=notes.get(p.partition_key, "") if node.action == NodeAction.REBUILD
                          else "skipped: " + (
                              "side-effect node not authorised" if node.job.has_side_effects
                              else "skipped by the requester"))
                 for i, p in enumerate(node.partitions)]
    Interval.objects.bulk_create(rows, batch_size=2000)


def _same_or_conflict(existing: BackfillRequest, digest: str) -> BackfillRequest:
    if existing.payload_hash != digest:
        raise ConflictError(
            f"idempotency key already used for request #{existing.pk} with different parameters",
            field="idempotency_key",
        )
    return existing


def request_overlaps(request: BackfillRequest) -> list[int]:
    """Active requests on the same job whose span overlaps this one (plans are contiguous)."""
    return list(
        BackfillRequest.objects.filter(
            job_id=request.job_id, status__in=REQUEST_ACTIVE,
            range_start__lt=request.range_end, range_end__gt=request.range_start,
        ).exclude(pk=request.pk).order_by("pk").values_list("pk", flat=True)
    )


def approval_plan(*, requester_id, job: Job, rebuilt: Iterable[Job], side_effects: Iterable[Job],
                  interval_count: int) -> list[PlannedStep]:
    """The approval steps a request gets on submission, in order: every registered
    approval rule's (`backfills/approval_rules.py`): the target dataset's owner; the
    owner of each rebuilt downstream node that produces data; the owner of each
    authorised side-effect node; an admin when the request has more intervals than
    BACKFILL_ADMIN_APPROVAL_OVER. Submission and the form's preview both use it.

    Separation of duties: an owner filing a request on their own dataset cannot approve
    it; that step goes to the admins (approver None) instead."""
    return approval_rules.approval_plan(requester_id=requester_id, job=job, rebuilt=rebuilt,
                                        side_effects=side_effects, interval_count=interval_count)


def _approval_steps(request: BackfillRequest) -> list[ApprovalStep]:
    rebuilt = [name for name, action in (request.node_actions or {}).items() if action == NodeAction.REBUILD]
    plan = approval_plan(
        requester_id=request.requested_by_id, job=request.job,
        rebuilt=Job.objects.filter(name__in=rebuilt).select_related("dataset__owner"),
        side_effects=request.side_effects.select_related("dataset__owner"),
        interval_count=Interval.objects.filter(request=request).count(),
    )
    return [ApprovalStep(request=request, kind=step.kind, dataset=step.dataset, job=step.job, approver=step.approver)
            for step in plan]


def backfill_request_submit(*, actor, request_id, confirm_overlap: bool = False) -> BackfillRequest:
    """Freeze and submit a draft.

    1. Only the requester (or an admin) submits.
    2. Overlap with an active request on the same job and intervals is refused
       unless the requester confirms it; the overlap is recorded either way.
    3. In one transaction: freeze the code version on the request and every interval,
       generate the approval steps, move draft -> pending_approval with its audit row.
    """
    request = request_get(request_id)
    policy.require_submit(actor, request)
    if request.status != RequestStatus.DRAFT:
        raise ConflictError(f"request #{request.pk} is {request.status}; only a draft can be submitted", field="status")
    code_version = request.job.current_code_version
    jobs = list(Job.objects.filter(pk__in=Interval.objects.filter(request=request).values("job_id").distinct())
                .select_related("current_code_version"))
    missing = [j.name for j in jobs if j.current_code_version is None]
    if code_version is None or missing:
        raise ConflictError(f"job {', '.join(missing) or request.job.name} has no code version; sync the catalog first",
                            field="job")
    _refuse_stale_since_draft(request)
    overlaps = request_overlaps(request)
    if overlaps and not confirm_overlap:
        ids = ", ".join(f"#{pk}" for pk in overlaps)
        raise ConflictError(
            f"overlaps active request(s) {ids} on the same job and intervals; confirm to submit anyway",
            field="confirm_overlap",
        )
    with transaction.atomic():
        for job in jobs:  # each job's definition is frozen as it is now
            Interval.objects.filter(request=request, job=job).update(code_version=job.current_code_version)
        steps = ApprovalStep.objects.bulk_create(_approval_steps(request))
        notify_approvers(request, steps)
        request_transition(
            request, to=RequestStatus.PENDING_APPROVAL, actor=actor, action="request.submit",
            updates={"code_version": code_version, "submitted_at": timezone.now(), "overlaps": overlaps},
            data={"code_version": code_version.hash, "overlaps": overlaps, "intervals": request.interval_count,
                  "code_versions": {j.name: j.current_code_version.hash for j in jobs},
                  **({"stale": request.stale} if request.stale else {})},
        )
    return request


def _refuse_stale_since_draft(request: BackfillRequest) -> None:
    """A later partition of a depends_on_past job published after the draft was made
    read the old chain too, but is not in the plan the submission would freeze: refuse
    (409 on `stale`) rather than leave it silently stale."""
    new: list[str] = []
    for name, record in (request.stale or {}).items():
        job = Job.objects.select_related("dataset").filter(name=name).first()
        last = (Interval.objects.filter(request=request, job__name=name).order_by("-start")
                .values_list("partition_key", "start", "end").first())
        if job is None or last is None:
            continue
        after = PlannedInterval(last[0], last[1], last[2], job.dataset.grain, job.dataset.timezone)
        excluded = set(record.get("excluded", []))
        new += [f"{name} {p.partition_key}" for p in published_after(job=job, after=after)
                if p.partition_key not in excluded]
    if new:
        raise ConflictError(
            f"published since this draft was made, and stale after what it republishes: {', '.join(new[:10])}"
            f"{' and more' if len(new) > 10 else ''}; cancel the draft and file the request again to include "
            "or exclude them", field="stale")


def approval_step_decide(*, actor, step: ApprovalStep, approve: bool, comment: str = "") -> ApprovalStep:
    """Approve or reject one step. The request follows: approved when every step is,
    rejected on the first rejection (its other steps are cancelled)."""
    request = step.request
    policy.require_decide_step(actor, step, approve=approve)
    if not approve and not (comment or "").strip():
        raise ValidationError("say why you reject, so the requester can fix it", field="comment")
    if step.status != StepStatus.PENDING:
        raise ConflictError(f"step #{step.pk} is already {step.status}", field="status")
    if request.status != RequestStatus.PENDING_APPROVAL:
        raise ConflictError(f"request #{request.pk} is {request.status}; it is not waiting for approval", field="status")
    with transaction.atomic():
        step_transition(step, to=StepStatus.APPROVED if approve else StepStatus.REJECTED, actor=actor, comment=comment)
        if not approve:
            for other in ApprovalStep.objects.filter(request=request, status=StepStatus.PENDING):
                other.request = request
                step_transition(other, to=StepStatus.CANCELLED, actor=actor, comment="request rejected")
            request_transition(request, to=RequestStatus.REJECTED, actor=actor, reason=comment,
                               updates={"decided_at": timezone.now()}, action="request.reject")
        elif not ApprovalStep.objects.filter(request=request).exclude(status=StepStatus.APPROVED).exists():
            request_transition(request, to=RequestStatus.APPROVED, actor=actor, reason=comment,
                               updates={"decided_at": timezone.now()}, action="request.approve")
            pk = request.pk
            transaction.on_commit(lambda: request_start_after_approval(request_id=pk))
    return step


def request_lock(request_id: int) -> None:
    """Inside a transaction: wait for whoever else is moving this request (the hand-off
    after a commit and the sweeper repairing a lost one), so that the second finds the
    work done. SQLite's IMMEDIATE transactions already serialise writers."""
    list(BackfillRequest.objects.select_for_update().filter(pk=request_id).values_list("pk", flat=True))


def request_start_after_approval(*, request_id: int) -> bool:
    """approved -> running, and execution is asked to dispatch it (a task sent through
    the outbox, in the same transaction). Runs after the approval commits, and from the
    sweeper when that was lost. Returns whether it started the request (False: someone
    did already, or it is no longer approved)."""
    with transaction.atomic():
        request_lock(request_id)
        request = request_get(request_id)
        if request.status != RequestStatus.APPROVED:
            return False
        request_transition(request, to=RequestStatus.RUNNING, actor=None, reason="all approval steps approved",
                           action="request.start")
        enqueue("execution.dispatch_request", request.pk, headers={"request_id": request.pk})
    return True


def backfill_request_decide(*, actor, request_id, approve: bool, comment: str = "") -> BackfillRequest:
    """Request-level approve/reject: decides the pending steps this actor may decide."""
    request = request_get(request_id)
    steps = [s for s in request.approval_steps.select_related("dataset", "approver").filter(status=StepStatus.PENDING)]
    mine = [s for s in steps if policy.is_step_approver(actor, s)]
    if not mine:
        # Read again: a concurrent decision (the same approver's double click, or the
        # last step decided meanwhile) is a conflict, not a refusal of the rightful
        # approver (which would write a `denied` row against them).
        request.refresh_from_db()
        if request.status != RequestStatus.PENDING_APPROVAL:
            raise ConflictError(f"request #{request.pk} is {request.status}; it is not waiting for approval", field="status")
        decided = [s for s in request.approval_steps.select_related("dataset", "approver").exclude(
            status=StepStatus.PENDING) if policy.is_step_approver(actor, s)]
        if decided:
            raise ConflictError(f"your step of request #{request.pk} was already decided ({decided[0].status})",
                                field="status")
        policy.require_decide_request(actor, request, mine, approve=approve)
    for step in mine:
        step.request = request
        approval_step_decide(actor=actor, step=step, approve=approve, comment=comment)
        request.refresh_from_db()
        if request.status != RequestStatus.PENDING_APPROVAL:
            break
    return request


def backfill_request_cancel(*, actor, request_id, reason: str) -> BackfillRequest:
    """Cancel: the requester, on-call or an admin, saying why (as reject and rollback
    do). Open intervals are cancelled with it."""
    request = request_get(request_id)
    policy.require_operate(actor, request, "request.cancel")
    reason = (reason or "").strip()
    if not reason:
        raise ValidationError("say why you cancel; the requester and auditors will read it", field="reason")

    def cancel() -> BackfillRequest:
        with transaction.atomic():
            # The audit chain's lock before the request's rows, as a publication and a
            # dispatch take it before they touch the request (core/retry.py).
            audit_serialise()
            request = request_get(request_id)  # again: a deadlock's retry reads it anew
            had_work = request.status in (RequestStatus.APPROVED, RequestStatus.RUNNING)
            request_transition(request, to=RequestStatus.CANCELLED, actor=actor, reason=reason,
                               action="request.cancel")
            for step in ApprovalStep.objects.filter(request=request, status=StepStatus.PENDING):
                step.request = request
                step_transition(step, to=StepStatus.CANCELLED, actor=actor, comment="request cancelled")
            intervals_bulk_transition(request, frm=IntervalStatus.PLANNED, to=IntervalStatus.CANCELLED, actor=actor,
                                      reason=f"request cancelled: {reason}")
            # A failed request given up: its failed intervals will not be retried either.
            intervals_bulk_transition(request, frm=IntervalStatus.FAILED, to=IntervalStatus.CANCELLED, actor=actor,
                                      reason=f"request cancelled: {reason}")
            if had_work:
                # Once this commits, its runs (execution's) stop. That is a transaction of
                # its own: if it fails (a worker moved a run meanwhile), the cancel still
                # stands, and the sweeper stops what is left (robust: logged, not raised).
                pk = request.pk
                transaction.on_commit(lambda: run_control().stop_runs(request_id=pk, actor=actor, reason=reason),
                                      robust=True)
        return request

    return run_again_if_deadlocked(cancel, what=f"cancelling request #{request.pk}")
