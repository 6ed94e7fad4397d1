"""The broker seam of the transactional outbox: sending committed rows, re-sending
what was never sent, counting a queue's messages.

The writer, `enqueue`, lives in `core/outbox.py` so that every layer can hand work to
a task by name in its own transaction; it is re-exported here for execution's callers.
`send` is registered there as the sender when the execution app starts (apps.py).
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta

from django.utils import timezone

from backfill_portal.core.outbox import BACKFILL_QUEUE, PRODUCTION_QUEUE, enqueue
from backfill_portal.core.rows import update_row
from backfill_portal.core.services.audit import delete_audited_in_batches
from backfill_portal.execution.models import TaskOutbox

__all__ = ["BACKFILL_QUEUE", "PRODUCTION_QUEUE", "broker_queue_depth", "enqueue", "outbox_purge", "outbox_resend",
           "send"]

logger = logging.getLogger(__name__)


# -- the broker seam ----------------------------------------------------------------------------
# Every send goes through one publisher, `publisher(task, args, headers, queue, eta)`,
# which raises when it cannot send. `broker_publish` (Celery's broker) is the default.
# Tests and benchmarks that run the tasks themselves, or play a broker that is down,
# route the sends elsewhere with `use_publisher(...)` or `set_publisher(...)`; the
# outbox around the send (the row, the send after commit, `sent_at`, the sweeper's
# resend) is the same either way.

Publisher = Callable[..., None]


def broker_publish(task: str, args: list, headers: dict, queue: str, eta=None) -> None:
    """The default publisher: send the task through Celery's broker (`eta`: an aware
    datetime before which it is not delivered)."""
    from backfill_portal.celery import app

    app.send_task(task, args=args, headers=headers, queue=queue, eta=eta)


_publisher: Publisher = broker_publish


def set_publisher(publisher: Publisher | None) -> Publisher:
    """Send every task through `publisher` from now on, in this process (None: through
    the broker again); returns the publisher it replaces."""
    global _publisher
    previous, _publisher = _publisher, publisher or broker_publish
    return previous


@contextmanager
def use_publisher(publisher: Publisher | None) -> Iterator[Publisher]:
    """`set_publisher(publisher)` for the block; the previous publisher again after it."""
    previous = set_publisher(publisher)
    try:
        yield publisher or broker_publish
    finally:
        set_publisher(previous)


def send(row: TaskOutbox) -> bool:
    """Send a committed row, then mark it sent. The row is not read again first: if
    the sweeper sent it meanwhile (it waits 30 s), the task goes twice, which tasks
    tolerate by design."""
    try:
        _publisher(row.task, row.args, row.headers, row.queue, row.eta)
    except Exception:  # broker down: the sweeper tries again
        logger.exception("could not send %s %s; the sweeper will retry", row.task, row.args)
        return False
    update_row(TaskOutbox, row.pk, {"sent_at": timezone.now()}, where={"sent_at": None})
    return True


def broker_queue_depth(queue: str) -> int | None:
    """How many messages the broker holds in `queue` (not those a worker has taken),
    or None when it cannot say (unreachable). An absent queue holds none: Redis drops
    an empty list, and a restarted Redis has no keys at all."""
    from backfill_portal.celery import app

    try:
        with app.connection_for_read() as conn:
            conn.ensure_connection(max_retries=1)
            return int(conn.default_channel.queue_declare(queue=queue, passive=False).message_count)
    except Exception as exc:
        logger.warning("cannot count the messages in queue %s: %s", queue, exc)
        return None


def outbox_resend(*, older_than_seconds: int = 30) -> int:
    """Send what was committed but never sent (the process died, or the broker was
    down, between commit and send). Returns how many were sent."""
    cutoff = timezone.now() - timedelta(seconds=older_than_seconds)
    rows = TaskOutbox.objects.filter(sent_at__isnull=True, created_at__lt=cutoff).order_by("pk")[:500]
    return sum(1 for row in rows if send(row))


def outbox_purge(*, sent_before, actor=None, reason: str = "") -> int:
    """Delete the outbox rows sent before `sent_before`: once sent, a row is history (a
    lost message is re-sent from the run's own state, never from an old row); a row
    not yet sent is never deleted, however old. In batches, each with its audit row
    (how many, which ids). Returns how many."""
    return delete_audited_in_batches(
        TaskOutbox.objects.filter(sent_at__isnull=False, sent_at__lt=sent_before),
        action="task_outbox.purge", object_type="task_outbox", counted_as="rows", actor=actor, reason=reason,
        data={"sent_before": sent_before.isoformat()})
