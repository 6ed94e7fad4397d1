"""The portal's shared locks on PostgreSQL: transaction-level advisory locks that every
writer of a kind waits for (the audit chain, the dispatch's)."""
from __future__ import annotations

from django.conf import settings
from django.db import connection


def shared_lock(key: int) -> None:
    """Take the advisory lock `key` until this transaction ends (PostgreSQL only; SQLite's
    IMMEDIATE transactions already serialise writers). In the same statement, the rest
    of the transaction gets PostgreSQL's idle-in-transaction timeout of
    SHARED_LOCK_IDLE_SECONDS: a holder whose process then stops talking (frozen, or
    suspended with its VM) is ended by the server and rolled back, instead of holding
    every other writer until it resumes. Only from here on, and only for this
    transaction: a rollback waiting minutes for the warehouse's readers holds no such
    lock while it waits."""
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        if settings.SHARED_LOCK_IDLE_SECONDS:
            cursor.execute("SELECT pg_advisory_xact_lock(%s), set_config('idle_in_transaction_session_timeout', %s, true)",
                           [key, f"{settings.SHARED_LOCK_IDLE_SECONDS}s"])
        else:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [key])
