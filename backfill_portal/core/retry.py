"""Running a whole transaction again when PostgreSQL broke a deadlock by aborting it.

Workers lock a run's or an interval's row and then the audit chain's lock (an audit
batch takes it at its end); a person's request-level operation (cancel, stopping the
runs) takes the chain's lock first and then many rows of the same request. Two such
transactions can each hold what the other waits for; PostgreSQL aborts one of them
after `deadlock_timeout`. For the person's operation that is no reason to fail: nothing
of it was written, and the same transaction run again finds the worker done."""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from django.db import DatabaseError, connection

logger = logging.getLogger(__name__)

T = TypeVar("T")

# deadlock_detected, serialization_failure: the transaction was aborted and may be run again.
RETRYABLE_STATES = frozenset({"40P01", "40001"})


def is_retryable(exc: BaseException | None) -> bool:
    """Whether `exc` (or what it wraps) is PostgreSQL aborting a transaction to break a
    deadlock or a serialization conflict."""
    seen = 0
    while exc is not None and seen < 8:
        if getattr(exc, "sqlstate", None) in RETRYABLE_STATES:
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def run_again_if_deadlocked(work: Callable[[], T], *, what: str, attempts: int = 3,
                            also: tuple[type[Exception], ...] = ()) -> T:
    """`work()` (which opens and commits its own transaction), run again up to
    `attempts` times in all when the database aborted it to break a deadlock, or it
    raised one of `also` (a lost race the next reading settles). Inside an outer
    transaction it runs once: that transaction is aborted too, and only its owner can
    run it again."""
    for attempt in range(1, attempts + 1):
        try:
            return work()
        except (DatabaseError, *also) as exc:
            if (not (isinstance(exc, also) or is_retryable(exc)) or attempt == attempts
                    or connection.in_atomic_block):
                raise
            logger.warning("%s was aborted (%s; attempt %s of %s); running it again",
                           what, "a lost race" if isinstance(exc, also) else "a deadlock", attempt, attempts)
            time.sleep(0.05 * attempt)
    raise AssertionError("unreachable")


def send_again_if_deadlocked(task, work: Callable[[], T], *, countdown: float = 1.0, max_retries: int = 5) -> T:
    """`work()` for a Celery task (bound, safe to run twice): when the database aborted
    its transaction to break a deadlock (a person's cancel or rollback took the same rows
    in the other order), the task is sent again after `countdown` seconds instead of
    failing at ERROR and waiting for the sweeper. Anything else is raised as it is."""
    try:
        return work()
    except DatabaseError as exc:
        if not is_retryable(exc) or connection.in_atomic_block:
            raise
        logger.warning("task %s was aborted by the database to break a deadlock; sending it again in %s s",
                       task.name, countdown)
        raise task.retry(exc=exc, countdown=countdown, max_retries=max_retries) from exc
