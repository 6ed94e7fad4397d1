"""Hand-off cascades: the target publishes, then each direct downstream owner decides
within a window whether to rebuild. Accepting files a linked cascade request in the
owner's name; declining records why; unanswered items expire."""
from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from backfill_portal.backfills import policy
from backfill_portal.backfills.choices import Cascade
from backfill_portal.backfills.models import BackfillRequest, HandoffItem
from backfill_portal.backfills.services.notifications import notify
from backfill_portal.backfills.services.requests import backfill_request_create, backfill_request_submit
from backfill_portal.catalog.lineage import covered_partitions
from backfill_portal.core.errors import ConflictError, NotFound, ValidationError
from backfill_portal.core.services.audit import audit_record

Status = HandoffItem.Status


def handoffs_open_for(*, request_id: int) -> list[HandoffItem]:
    """One item per direct consumer of the target (side-effect nodes excluded: they
    are never run by a hand-off). Idempotent."""
    request = BackfillRequest.objects.select_related("job__dataset").get(pk=request_id)
    if request.cascade != Cascade.HANDOFF:
        return []
    deadline = timezone.now() + timedelta(hours=settings.HANDOFF_WINDOW_HOURS)
    items = []
    with transaction.atomic():
        for consumer in request.job.dataset.consumers.exclude(has_side_effects=True).select_related("dataset__owner"):
            parts = covered_partitions(grain=consumer.dataset.grain, timezone=consumer.dataset.timezone,
                                       start=request.range_start, end=request.range_end)
            item, made = HandoffItem.objects.get_or_create(
                request=request, job=consumer,
                defaults={"owner": consumer.dataset.owner, "deadline": deadline,
                          "first_partition": parts[0].partition_key, "last_partition": parts[-1].partition_key})
            if made:
                audit_record(actor=None, action="handoff.open", object_type="handoff", object_id=item.pk,
                             request_id=request.pk, dataset=consumer.dataset.name, to_state=Status.PENDING,
                             data={"owner": item.owner.username, "deadline": deadline.isoformat(),
                                   "first": item.first_partition, "last": item.last_partition})
                _notify(item)
            items.append(item)
    return items


def _notify(item: HandoffItem) -> None:
    notify(users=[item.owner], subject=f"Hand-off: rebuild {item.job.name}? (request #{item.request_id})",
           body=(f"Request #{item.request_id} republished {item.request.job.dataset.name} for "
                 f"{item.first_partition}..{item.last_partition}. Decide before {item.deadline:%Y-%m-%d %H:%M} UTC "
                 f"whether to rebuild {item.job.name}."))


def handoff_get(item_id) -> HandoffItem:
    try:
        return HandoffItem.objects.select_related("request__job__dataset", "job__dataset", "owner").get(pk=int(item_id))
    except (HandoffItem.DoesNotExist, TypeError, ValueError):
        raise NotFound(f"hand-off item {item_id} does not exist") from None


def _check(*, actor, item: HandoffItem, to: str) -> None:
    policy.require_decide_handoff(actor, item, to=to)
    if item.status != Status.PENDING:
        raise ConflictError(f"hand-off #{item.pk} is already {item.status}", field="status")
    if timezone.now() > item.deadline:
        raise ConflictError(f"hand-off #{item.pk} expired at {item.deadline:%Y-%m-%d %H:%M} UTC", field="deadline")


def _decide(*, actor, item: HandoffItem, to: str, comment: str, follow_up: BackfillRequest | None = None) -> None:
    claimed = HandoffItem.objects.filter(pk=item.pk, status=Status.PENDING).update(
        status=to, decided_at=timezone.now(), comment=comment, follow_up=follow_up)
    if claimed != 1:
        raise ConflictError(f"hand-off #{item.pk} was decided meanwhile", field="status")
    audit_record(actor=actor, action=f"handoff.{to}", object_type="handoff", object_id=item.pk,
                 request_id=item.request_id, dataset=item.job.dataset.name, from_state=Status.PENDING,
                 to_state=to, reason=comment, data={"follow_up": follow_up.pk} if follow_up else None)


def handoff_accept(*, actor, item_id, comment: str = "") -> HandoffItem:
    """Accept: file (create and submit) a cascade request from this node downwards."""
    item = handoff_get(item_id)
    _check(actor=actor, item=item, to=Status.ACCEPTED)
    with transaction.atomic():
        follow_up, _ = backfill_request_create(
            actor=actor, job=item.job.name, start=item.first_partition, end=item.last_partition,
            reason=comment or f"hand-off from request #{item.request_id}", cascade=Cascade.CASCADE,
            idempotency_key=f"handoff-{item.pk}")
        BackfillRequest.objects.filter(pk=follow_up.pk).update(parent=item.request)
        _decide(actor=actor, item=item, to=Status.ACCEPTED, comment=comment, follow_up=follow_up)
        backfill_request_submit(actor=actor, request_id=follow_up.pk, confirm_overlap=True)
    item.refresh_from_db()
    return item


def handoff_decline(*, actor, item_id, comment: str) -> HandoffItem:
    # Which item, and whether it is the actor's to decide, before what they wrote: an
    # unknown id is a 404 and someone else's item an audited 403, as for accept.
    item = handoff_get(item_id)
    _check(actor=actor, item=item, to=Status.DECLINED)
    if not (comment or "").strip():
        raise ValidationError("say why the downstream stays on its current version", field="comment")
    with transaction.atomic():
        _decide(actor=actor, item=item, to=Status.DECLINED, comment=comment)
    item.refresh_from_db()
    return item


def handoffs_expire(*, now=None) -> int:
    """Periodic: unanswered items past their deadline expire, each with its audit row."""
    now = now or timezone.now()
    expired = 0
    for item in HandoffItem.objects.filter(status=Status.PENDING, deadline__lt=now).select_related("job__dataset"):
        with transaction.atomic():
            if HandoffItem.objects.filter(pk=item.pk, status=Status.PENDING).update(status=Status.EXPIRED,
                                                                                   decided_at=now) == 1:
                audit_record(actor=None, action="handoff.expired", object_type="handoff", object_id=item.pk,
                             request_id=item.request_id, dataset=item.job.dataset.name,
                             from_state=Status.PENDING, to_state=Status.EXPIRED, reason="no answer before the deadline")
                expired += 1
    return expired
