"""Approval rules: each one adds the approval steps a request gets on submission for one
reason (the target's owner, a cascade's owners, an authorised side-effect node's owner,
a large range's admin). `approval_plan` runs every registered rule, in their order, and
concatenates their steps; a new rule is one function and one registration.

    @register_rule("pii_officer", order=250)
    def pii_officer(plan: ApprovalInput) -> Iterable[PlannedStep]:
        if plan.job.dataset.team.name == "pii":
            yield PlannedStep(StepKind.ADMIN, None, None)

Separation of duties holds for every rule that names an owner through
`ApprovalInput.approver`: nobody approves their own request (that step goes to the
admins, approver None).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from django.conf import settings

from backfill_portal.backfills.choices import StepKind
from backfill_portal.catalog.kinds import JobKindBase, kind_get
from backfill_portal.catalog.models import Job
from backfill_portal.core.errors import ConflictError
from backfill_portal.core.registry import NotRegistered, Registry


@dataclass(frozen=True)
class PlannedStep:
    kind: str
    job: Job | None  # None for the admin step
    approver: object | None  # a User; None: any admin

    @property
    def dataset(self):
        return self.job.dataset if self.job else None


@dataclass(frozen=True)
class ApprovalInput:
    """What a rule sees of the request being submitted (or previewed)."""

    requester_id: int
    job: Job
    rebuilt: tuple[Job, ...]  # downstream nodes the cascade rebuilds
    side_effects: tuple[Job, ...]  # side-effect nodes the request authorises
    interval_count: int

    def approver(self, owner):
        return None if owner.pk == self.requester_id else owner


Rule = Callable[[ApprovalInput], Iterable[PlannedStep]]


@dataclass(frozen=True)
class ApprovalRule:
    name: str
    order: int
    steps: Rule


registry: Registry[ApprovalRule] = Registry("approval rule")


def register_rule(name: str, *, order: int) -> Callable[[Rule], Rule]:
    """`@register_rule("name", order=...)`: rules run by ascending order (then name)."""

    def register(fn: Rule) -> Rule:
        registry.register(name, ApprovalRule(name=name, order=order, steps=fn))
        return fn

    return register


def unregister_rule(name: str) -> None:
    registry.unregister(name)


def rules() -> list[ApprovalRule]:
    return sorted(registry, key=lambda r: (r.order, r.name))


def approval_plan(*, requester_id, job: Job, rebuilt: Iterable[Job], side_effects: Iterable[Job],
                  interval_count: int) -> list[PlannedStep]:
    plan = ApprovalInput(requester_id=requester_id, job=job, rebuilt=tuple(rebuilt), side_effects=tuple(side_effects),
                         interval_count=interval_count)
    return [step for rule in rules() for step in rule.steps(plan)]


def kind_of(job: Job) -> JobKindBase:
    """The job's registered kind; a job whose kind nobody registered cannot be planned
    (it would otherwise silently get no owner step)."""
    try:
        return kind_get(job.kind)
    except NotRegistered:
        raise ConflictError(f"job {job.name} is of kind {job.kind!r}, which no registered job kind provides",
                            field="job") from None


# -- the built-in rules ---------------------------------------------------------------------


@register_rule("dataset_owner", order=100)
def dataset_owner(plan: ApprovalInput) -> Iterable[PlannedStep]:
    """The target dataset's owner."""
    yield PlannedStep(StepKind.OWNER, plan.job, plan.approver(plan.job.dataset.owner))


@register_rule("cascade_owners", order=200)
def cascade_owners(plan: ApprovalInput) -> Iterable[PlannedStep]:
    """The owner of each rebuilt downstream node that produces data (a side-effect kind's
    node is approved as a side effect, when authorised, by the next rule)."""
    for node in sorted((j for j in plan.rebuilt if not kind_of(j).has_side_effects), key=lambda j: j.name):
        yield PlannedStep(StepKind.DOWNSTREAM, node, plan.approver(node.dataset.owner))


@register_rule("side_effect_owners", order=300)
def side_effect_owners(plan: ApprovalInput) -> Iterable[PlannedStep]:
    """The owner of each side-effect node the request authorises."""
    for effect in sorted(plan.side_effects, key=lambda j: j.name):
        yield PlannedStep(StepKind.SIDE_EFFECT, effect, plan.approver(effect.dataset.owner))


@register_rule("admin_over_size", order=900)
def admin_over_size(plan: ApprovalInput) -> Iterable[PlannedStep]:
    """An admin, when the request has more intervals than BACKFILL_ADMIN_APPROVAL_OVER."""
    if plan.interval_count > settings.BACKFILL_ADMIN_APPROVAL_OVER:
        yield PlannedStep(StepKind.ADMIN, None, None)
