"""Celery tasks of reconciliation and retention. Their names keep the apps they were
first registered under: outbox rows and broker messages name tasks by name."""
from celery import shared_task

from backfill_portal.core.retry import send_again_if_deadlocked
from backfill_portal.recovery.reconciliation import request_reconcile_when_ready


@shared_task(name="backfills.reconcile_request", bind=True, acks_late=True)
def reconcile_request(self, request_id: int) -> str:
    """Compute a reconciling request's manifest and four numbers. Safe twice."""
    return send_again_if_deadlocked(self, lambda: request_reconcile_when_ready(request_id=request_id))


@shared_task(name="execution.purge_versions")
def purge_versions() -> dict:
    """Retention: purge versions older than VERSION_RETENTION_DAYS (never the current,
    the previous verified one, or anything a rollback or a running job needs), and the
    OpenLineage events delivered more than LINEAGE_EVENT_RETENTION_DAYS ago, and the
    task outbox rows sent more than TASK_OUTBOX_RETENTION_DAYS ago, and the files of
    writers that died before their commit marker."""
    from backfill_portal.recovery.retention import (
        lineage_events_purge_expired,
        task_outbox_purge_expired,
        versions_purge_expired,
        warehouse_orphans_sweep,
    )

    counts = versions_purge_expired(actor=None)
    counts["lineage_events_purged"] = lineage_events_purge_expired(actor=None)["purged"]
    counts["task_outbox_purged"] = task_outbox_purge_expired(actor=None)["purged"]
    counts["orphan_files_deleted"] = warehouse_orphans_sweep(actor=None)["files"]
    return counts
