"""Celery tasks of reconciliation and retention. Their names keep the apps they were
first registered under: outbox rows and broker messages name tasks by name."""
from celery import shared_task

from backfill_portal.recovery.reconciliation import request_reconcile_when_ready


@shared_task(name="backfills.reconcile_request", acks_late=True)
def reconcile_request(request_id: int) -> str:
    """Compute a reconciling request's manifest and four numbers. Safe twice."""
    return request_reconcile_when_ready(request_id=request_id)


@shared_task(name="execution.purge_versions")
def purge_versions() -> dict:
    """Retention: purge versions older than VERSION_RETENTION_DAYS (never the current,
    the previous verified one, or anything a rollback or a running job needs)."""
    from backfill_portal.recovery.retention import versions_purge_expired

    return versions_purge_expired(actor=None)
