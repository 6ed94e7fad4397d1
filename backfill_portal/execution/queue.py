"""Enqueue Celery work through a transactional outbox.

`enqueue` writes a TaskOutbox row in the caller's transaction and sends it after
commit. If the process dies between commit and send, the row stays unsent and the
sweeper re-sends it. Tasks re-read state, so a duplicate send is harmless.
"""
from __future__ import annotations

import functools
import logging
from datetime import timedelta

from django.db import connection, transaction
from django.utils import timezone

from backfill_portal.core.rows import insert_row
from backfill_portal.execution.models import TaskOutbox

logger = logging.getLogger(__name__)

PRODUCTION_QUEUE = "production"
BACKFILL_QUEUE = "backfill"


def enqueue(task: str, *args, headers: dict | None = None, queue: str = BACKFILL_QUEUE) -> TaskOutbox:
    row = insert_row(TaskOutbox(task=task, args=list(args), headers=headers or {}, queue=queue))
    transaction.on_commit(lambda: send(row))
    return row


def _publish(task: str, args: list, headers: dict, queue: str) -> None:
    from backfill_portal.celery import app

    app.send_task(task, args=args, headers=headers, queue=queue)


def send(row: TaskOutbox) -> bool:
    """Send a committed row, then mark it sent. The row is not read again first: if
    the sweeper sent it meanwhile (it waits 30 s), the task goes twice, which tasks
    tolerate by design."""
    try:
        _publish(row.task, row.args, row.headers, row.queue)
    except Exception:  # broker down: the sweeper tries again
        logger.exception("could not send %s %s; the sweeper will retry", row.task, row.args)
        return False
    with connection.cursor() as cursor:
        cursor.execute(_stamp_statement(connection.vendor), [timezone.now(), row.pk])
    return True


@functools.lru_cache(maxsize=4)
def _stamp_statement(vendor: str) -> str:
    """Mark a row sent, if nothing did yet: fixed text, as it runs for every task sent."""
    meta, quote = TaskOutbox._meta, connection.ops.quote_name
    sent_at = quote(meta.get_field("sent_at").column)
    return f"UPDATE {quote(meta.db_table)} SET {sent_at} = %s WHERE {quote(meta.pk.column)} = %s AND {sent_at} IS NULL"


def outbox_resend(*, older_than_seconds: int = 30) -> int:
    """Send what was committed but never sent (the process died, or the broker was
    down, between commit and send). Returns how many were sent."""
    cutoff = timezone.now() - timedelta(seconds=older_than_seconds)
    rows = TaskOutbox.objects.filter(sent_at__isnull=True, created_at__lt=cutoff).order_by("pk")[:500]
    return sum(1 for row in rows if send(row))


def outbox_purge(*, older_than_days: int = 7) -> int:
    cutoff = timezone.now() - timedelta(days=older_than_days)
    count, _ = TaskOutbox.objects.filter(sent_at__lt=cutoff).delete()
    return count
