from celery import shared_task

from backfill_portal.backfills.services.handoff import handoffs_expire
from backfill_portal.backfills.services.reconciliation import request_reconcile_when_ready


@shared_task(name="backfills.expire_handoffs")
def expire_handoffs() -> int:
    return handoffs_expire()


@shared_task(name="backfills.reconcile_request", acks_late=True)
def reconcile_request(request_id: int) -> str:
    """Compute a reconciling request's manifest and four numbers. Safe twice."""
    return request_reconcile_when_ready(request_id=request_id)
