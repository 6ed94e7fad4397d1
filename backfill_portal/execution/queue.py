"""Enqueue Celery work through a transactional outbox.

`enqueue` writes a TaskOutbox row in the caller's transaction and sends it after
commit. If the process dies between commit and send, the row stays unsent and the
sweeper re-sends it. Tasks re-read state, so a duplicate send is harmless.
"""
from __future__ import annotations

import logging
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from backfill_portal.execution.models import TaskOutbox

logger = logging.getLogger(__name__)

PRODUCTION_QUEUE = "production"
BACKFILL_QUEUE = "backfill"


def enqueue(task: str, *args, headers: dict | None = None, queue: str = BACKFILL_QUEUE) -> TaskOutbox:
    row = TaskOutbox.objects.create(task=task, args=list(args), headers=headers or {}, queue=queue)
    transaction.on_commit(lambda: send(row.pk))
    return row


def _publish(task: str, args: list, headers: dict, queue: str) -> None:
    from backfill_portal.celery import app

    app.send_task(task, args=args, headers=headers, queue=queue)


def send(pk: int) -> bool:
    row = TaskOutbox.objects.filter(pk=pk, sent_at__isnull=True).first()
    if row is None:
        return False
    try:
        _publish(row.task, row.args, row.headers, row.queue)
    except Exception:  # broker down: the sweeper tries again
        logger.exception("could not send %s %s; the sweeper will retry", row.task, row.args)
        return False
    TaskOutbox.objects.filter(pk=pk, sent_at__isnull=True).update(sent_at=timezone.now())
    return True


def outbox_resend(*, older_than_seconds: int = 30) -> int:
    cutoff = timezone.now() - timedelta(seconds=older_than_seconds)
    pks = list(TaskOutbox.objects.filter(sent_at__isnull=True, created_at__lt=cutoff).values_list("pk", flat=True)[:500])
    return sum(1 for pk in pks if send(pk))


def outbox_purge(*, older_than_days: int = 7) -> int:
    cutoff = timezone.now() - timedelta(days=older_than_days)
    count, _ = TaskOutbox.objects.filter(sent_at__lt=cutoff).delete()
    return count
