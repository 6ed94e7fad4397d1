"""Who may do what: the one place services and pages ask.

Each rule is a `may_*` function returning a `Decision` (true or false, with the reason
a refusal gives). Services call the matching `require_*`, which records the refusal in
the audit log and raises PermissionDenied (core.roles.deny) with that reason; pages call
the `may_*` functions (or `request_actions`, which adds the request's state) to decide
which buttons and forms to offer, so a page never offers what its service refuses nor
hides what it allows (tests/governance/test_policy_agreement.py).

The rules (DESIGN.md, Governance):
- create           requester, owner, on-call or admin
- submit           the requester who filed it, or an admin
- decide a step    its approver (an admin for an admin step), never the requester
- operate          cancel, pause, resume, retry: the requester, on-call or an admin
- review           explain, recompute: the requester, the owner of any dataset the
                   request rebuilds (its target and its cascade), on-call or an admin
- sign off         the target owner; an admin other than the requester when the owner
                   filed it
- roll back        on-call, an admin, or the owner of every dataset involved
- hand-off         its downstream owner
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from django.db.models import Q

from backfill_portal.backfills.choices import IntervalStatus
from backfill_portal.backfills.choices import RequestStatus as R
from backfill_portal.backfills.choices import StepStatus
from backfill_portal.backfills.models import ApprovalStep, BackfillRequest, HandoffItem, Interval
from backfill_portal.backfills.transitions import REQUEST_EDGES
from backfill_portal.catalog.models import Dataset
from backfill_portal.core.roles import Role, deny, has_role, require_role
from backfill_portal.warehouse.models import Publication

# A request whose publications may be rolled back (and the state its rollback page needs).
# A cancelled one may have published partitions before the cancel: they can be rolled
# back too, and it stays cancelled (recovery/rollback.py).
ROLLBACKABLE_REQUEST_STATES = (R.RECONCILING, R.COMPLETED, R.FAILED, R.CANCELLED)


@dataclass(frozen=True)
class Decision:
    """May this user do it? `reason` says why not (the refusal's text); `note` is the
    page's sentence for the same refusal where it reads differently."""

    allowed: bool
    reason: str = ""
    note: str = ""
    dataset: str = ""  # the dataset the refusal's audit row names, if any

    def __bool__(self) -> bool:
        return self.allowed


ALLOW = Decision(True)


def _user_pk(user):
    return getattr(user, "pk", None) if getattr(user, "is_authenticated", False) else None


# A relationship (the requester of a request, the owner of a dataset, the approver of a
# step) grants power only while the person still holds the role behind it: taking a
# user's roles away (docs/security.md: "take their power away") must end what those
# roles let them do, not only what is checked by role alone. (The exploratory test
# approved, signed off and rolled back with every role removed.)
def _as_requester(user, request: BackfillRequest) -> bool:
    return request.requested_by_id == _user_pk(user) and has_role(user, *CREATORS)


def _is_owner(user, owner_id) -> bool:
    return owner_id is not None and owner_id == _user_pk(user) and has_role(user, Role.OWNER, Role.ADMIN)


# -- create and submit ------------------------------------------------------------------------

CREATORS = (Role.REQUESTER, Role.OWNER, Role.ONCALL, Role.ADMIN)


def may_create(user) -> bool:
    return has_role(user, *CREATORS)


def require_create(actor) -> None:
    require_role(actor, *CREATORS, action="request.create")


def may_submit(user, request: BackfillRequest) -> Decision:
    if _as_requester(user, request) or has_role(user, Role.ADMIN):
        return ALLOW
    return Decision(False, "only the requester can submit a request")


def require_submit(actor, request: BackfillRequest) -> None:
    decision = may_submit(actor, request)
    if not decision:
        raise deny(actor=actor, action="request.submit", reason=decision.reason,
                   object_type="request", object_id=request.pk, request_id=request.pk)


# -- approval steps ----------------------------------------------------------------------------


def is_step_approver(user, step: ApprovalStep) -> bool:
    """The step is this user's to decide: theirs, or an admin step and they are an admin.
    (Not yet whether they filed the request: see may_decide_step.)"""
    if step.approver_id is None:
        return has_role(user, Role.ADMIN)
    return _is_owner(user, step.approver_id)


def steps_decidable_by(user) -> Q:
    """is_step_approver as a filter on ApprovalStep, plus separation of duties."""
    mine = Q(approver=user) if has_role(user, Role.OWNER, Role.ADMIN) else Q(pk__in=[])
    if has_role(user, Role.ADMIN):
        mine |= Q(approver__isnull=True)
    return mine & ~Q(request__requested_by=user)


def may_decide_step(user, step: ApprovalStep, request: BackfillRequest | None = None) -> Decision:
    request = request or step.request
    if _user_pk(user) == request.requested_by_id:
        return Decision(False, "nobody approves a step of their own request")
    if step.approver_id is None:
        if not has_role(user, Role.ADMIN):
            return Decision(False, "this step is decided by an admin")
    elif step.approver_id != _user_pk(user):
        return Decision(False, f"this step is for {step.approver.username}, the owner of {step.dataset.name}",
                        dataset=step.dataset.name if step.dataset_id else "")
    elif not _is_owner(user, step.approver_id):
        return Decision(False, "deciding an owner's step needs the owner role, which this user no longer has",
                        dataset=step.dataset.name if step.dataset_id else "")
    return ALLOW


def require_decide_step(actor, step: ApprovalStep, *, approve: bool) -> None:
    request = step.request
    decision = may_decide_step(actor, step, request)
    if not decision:
        raise deny(actor=actor, action="approval.approve" if approve else "approval.reject", reason=decision.reason,
                   object_type="approval_step", object_id=step.pk, request_id=request.pk, dataset=decision.dataset)


def may_decide_request(user, request: BackfillRequest, steps: Iterable[ApprovalStep]) -> Decision:
    """Request-level approve/reject: some pending step of it is this user's to decide."""
    if _user_pk(user) == request.requested_by_id:
        return Decision(False, "nobody approves a step of their own request")
    if not any(s.status == StepStatus.PENDING and is_step_approver(user, s) for s in steps):
        return Decision(False, "no approval step of this request is yours to decide")
    return ALLOW


def require_decide_request(actor, request: BackfillRequest, steps: Iterable[ApprovalStep], *, approve: bool) -> None:
    decision = may_decide_request(actor, request, steps)
    if not decision:
        raise deny(actor=actor, action="approval.approve" if approve else "approval.reject", reason=decision.reason,
                   object_type="request", object_id=request.pk, request_id=request.pk)


# -- operating a request: cancel, pause, resume, retry ------------------------------------------


def may_operate(user, request: BackfillRequest, action: str = "request.operate") -> Decision:
    if _as_requester(user, request) or has_role(user, Role.ONCALL, Role.ADMIN):
        return ALLOW
    if action == "request.cancel":
        return Decision(False, "only the requester, on-call or an admin can cancel")
    return Decision(False, f"{action} needs the requester, on-call or an admin")


def require_operate(actor, request: BackfillRequest, action: str) -> None:
    """`action`: request.cancel, request.pause, request.resume or request.retry_failed."""
    decision = may_operate(actor, request, action)
    if not decision:
        raise deny(actor=actor, action=action, reason=decision.reason,
                   object_type="request", object_id=request.pk, request_id=request.pk)


# -- reviewing a reconciliation: explain, recompute; sign off -----------------------------------


def reviewers_owners(request: BackfillRequest) -> set:
    """The owners of every dataset the request rebuilds: its target and its cascade. Not
    a node the plan skips (a side-effect node not authorised, a node left out): nothing
    of theirs is rebuilt, so nothing of theirs is reviewed."""
    rebuilt = Interval.objects.filter(request=request).exclude(status=IntervalStatus.SKIPPED).values("job_id")
    return set(Dataset.objects.filter(job__in=rebuilt).values_list("owner_id", flat=True)) | {
        request.job.dataset.owner_id}


_REVIEW_REFUSAL = {
    "reconciliation.compute": "recomputing needs the requester, the dataset owner, on-call or an admin",
    "reconciliation.explain": "explaining needs the requester, the dataset owner, on-call or an admin",
}


def may_review(user, request: BackfillRequest, action: str = "reconciliation.explain") -> Decision:
    """The requester, the owner of any dataset the request rebuilds, on-call, admins."""
    if _user_pk(user) is not None and (
            _as_requester(user, request) or has_role(user, Role.ONCALL, Role.ADMIN)
            or (has_role(user, Role.OWNER) and _user_pk(user) in reviewers_owners(request))):
        return ALLOW
    return Decision(False, _REVIEW_REFUSAL[action])


def require_review(actor, request: BackfillRequest, action: str) -> None:
    """`action`: reconciliation.explain or reconciliation.compute."""
    decision = may_review(actor, request, action)
    if not decision:
        raise deny(actor=actor, action=action, object_type="request", object_id=request.pk,
                   request_id=request.pk, reason=decision.reason)


def may_sign_off(user, request: BackfillRequest) -> Decision:
    dataset = request.job.dataset
    owner = dataset.owner
    if owner.pk == request.requested_by_id:
        # Separation of duties: the owner filed it, so an admin (not the owner) signs.
        if has_role(user, Role.ADMIN) and _user_pk(user) != request.requested_by_id:
            return ALLOW
        return Decision(False, "the target owner filed this request; an admin other than the requester signs it off",
                        note=f"{owner.username} filed this request on their own dataset, so an admin signs it off.")
    if _is_owner(user, owner.pk):
        return ALLOW
    return Decision(False, f"only {owner.username}, the owner of {dataset.name}, signs off",
                    note=f"Only {owner.username}, the owner of {dataset.name}, signs off.")


def require_sign_off(actor, request: BackfillRequest) -> None:
    decision = may_sign_off(actor, request)
    if not decision:
        raise deny(actor=actor, action="reconciliation.signoff", object_type="request", object_id=request.pk,
                   request_id=request.pk, dataset=request.job.dataset.name, reason=decision.reason)


# -- rolling back ---------------------------------------------------------------------------------


def may_roll_back(user, datasets: Iterable[Dataset], action: str = "partition.rollback") -> Decision:
    """On-call, an admin, or the owner of every dataset involved."""
    datasets = list(datasets)
    if has_role(user, Role.ONCALL, Role.ADMIN) or (
            _user_pk(user) is not None and datasets and all(_is_owner(user, d.owner_id) for d in datasets)):
        return ALLOW
    return Decision(False, f"{action} needs on-call, an admin or the dataset owner")


def require_roll_back(actor, datasets: Iterable[Dataset], *, action: str, object_type: str, object_id,
                      request_id: int | None = None) -> None:
    """`action`: partition.rollback, request.rollback or rollback.rebuild."""
    datasets = list(datasets)
    decision = may_roll_back(actor, datasets, action)
    if not decision:
        raise deny(actor=actor, action=action, reason=decision.reason, object_type=object_type, object_id=object_id,
                   request_id=request_id, dataset=datasets[0].name if datasets else "")


def published_datasets(request: BackfillRequest) -> list[Dataset]:
    """Every dataset the request published (its cascade's too)."""
    # By id from the request's publications (indexed by request): a DISTINCT over the
    # joined datasets' every column sorted 27,000 rows on disk for a large request.
    return list(Dataset.objects.filter(pk__in=Publication.objects.filter(request=request).values("dataset_id"))
                .order_by("name"))


def request_rollback_datasets(request: BackfillRequest) -> list[Dataset]:
    """Whose owner a request rollback needs: every dataset it published, or its target
    when it published nothing."""
    return published_datasets(request) or [request.job.dataset]


def may_roll_back_partition(user, dataset: Dataset) -> Decision:
    if dataset.is_source:
        return Decision(False, f"{dataset.name} is a source; it has no versions to roll back")
    return may_roll_back(user, [dataset], "partition.rollback")


# -- hand-offs --------------------------------------------------------------------------------------


def may_decide_handoff(user, item: HandoffItem) -> Decision:
    if _is_owner(user, item.owner_id):
        return ALLOW
    return Decision(False, f"this hand-off is for {item.owner.username}")


def require_decide_handoff(actor, item: HandoffItem, *, to: str) -> None:
    decision = may_decide_handoff(actor, item)
    if not decision:
        raise deny(actor=actor, action=f"handoff.{to}", reason=decision.reason, object_type="handoff",
                   object_id=item.pk, request_id=item.request_id, dataset=item.job.dataset.name)


# -- a request action whose body is refused ------------------------------------------------------


def require_request_action(actor, request: BackfillRequest, action: str) -> None:
    """The permission half of a request action, asked when its body is refused: someone
    who may not act on the request at all is refused (and audited) before being told
    what is wrong with what they sent, as they would be with a valid body. Whether the
    request's state allows the action is left to the service (a 409), so an approver
    whose step was decided meanwhile still hears about their body.

    `action`: submit, cancel, approve, reject, explain, signoff or rollback."""
    if action == "submit":
        require_submit(actor, request)
    elif action == "cancel":
        require_operate(actor, request, "request.cancel")
    elif action in ("approve", "reject"):
        steps = list(request.approval_steps.select_related("dataset", "approver"))
        if _user_pk(actor) == request.requested_by_id or not any(is_step_approver(actor, s) for s in steps):
            require_decide_request(actor, request, [], approve=action == "approve")
    elif action == "explain":
        require_review(actor, request, "reconciliation.explain")
    elif action == "signoff":
        require_sign_off(actor, request)
    elif action == "rollback":
        require_roll_back(actor, request_rollback_datasets(request), action="request.rollback",
                          object_type="request", object_id=request.pk, request_id=request.pk)
    else:
        raise ValueError(f"unknown request action {action!r}")


# -- what the request page offers ----------------------------------------------------------------------


def request_actions(user, request: BackfillRequest, steps: Iterable[ApprovalStep], *, failed: int) -> set[str]:
    """The actions the request page offers this user: what the policy allows in the
    request's present state (`failed`: how many of its intervals failed). The services
    still check both, so a forged POST is refused."""
    status = request.status
    actions: set[str] = set()
    if status == R.DRAFT and may_submit(user, request):
        actions.add("submit")
    if status == R.PENDING_APPROVAL and may_decide_request(user, request, steps):
        actions.add("decide")
    operator = may_operate(user, request).allowed
    if operator and R.CANCELLED in REQUEST_EDGES.get(status, ()):
        actions.add("cancel")
    if operator and status == R.RUNNING:
        actions.add("resume" if request.paused else "pause")
    if operator and status in (R.RUNNING, R.FAILED) and failed:
        actions.add("retry")
    if status in ROLLBACKABLE_REQUEST_STATES:
        published = published_datasets(request)  # none: the service answers "nothing to roll back"
        if published and may_roll_back(user, published, "request.rollback"):
            actions.add("rollback")
    return actions
