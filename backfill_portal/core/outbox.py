"""The transactional outbox's writer: how any layer enqueues Celery work by task name.

`enqueue` writes a TaskOutbox row in the caller's transaction and hands it to the
sender after commit. The row is the execution app's model, reached by its label (as a
ForeignKey names a model), and the sender is the broker seam in `execution/queue.py`,
which the execution app registers when Django starts (`ExecutionConfig.ready`): so
backfills can hand work up to execution, the state and the work it needs committed
together, without importing it. If the process dies between commit and send (or no
sender is registered), the row stays unsent and the sweeper sends it; tasks re-read
state, so a duplicate send is harmless.
"""
from __future__ import annotations

from collections.abc import Callable

from django.apps import apps
from django.db import models, transaction

from backfill_portal.core.rows import insert_row

BACKFILL_QUEUE = "backfill"
PRODUCTION_QUEUE = "production"

_sender: Callable[[models.Model], object] | None = None


def outbox_sender_register(sender: Callable[[models.Model], object]) -> None:
    """`sender(row)` sends a committed outbox row to the broker and marks it sent."""
    global _sender
    _sender = sender


def enqueue(task: str, *args, headers: dict | None = None, queue: str = BACKFILL_QUEUE, eta=None) -> models.Model:
    """`eta`: an aware datetime before which the task is not delivered (a backoff)."""
    outbox = apps.get_model("execution", "TaskOutbox")
    row = insert_row(outbox(task=task, args=list(args), headers=headers or {}, queue=queue, eta=eta))
    transaction.on_commit(lambda: _send(row))
    return row


def _send(row: models.Model) -> None:
    if _sender is not None:
        _sender(row)
