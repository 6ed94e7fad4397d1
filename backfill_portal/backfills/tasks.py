from celery import shared_task

from backfill_portal.backfills.services.handoff import handoffs_expire


@shared_task(name="backfills.expire_handoffs")
def expire_handoffs() -> int:
    return handoffs_expire()
