"""The advisory locks recovery's transactions take on PostgreSQL (SQLite's IMMEDIATE
transactions already serialise writers), and their order: the rollback lock, then a
request's reconciliation lock, then rows, then the audit chain's (docs/architecture.md)."""
from __future__ import annotations

from django.db import connection

# Keys of the transaction-scoped advisory locks.
ROLLBACK_LOCK = 7351003  # a rollback's warehouse move and metadata mirror; a sign-off
RECONCILIATION_LOCK = 7351002  # with a request's id: computing, explaining, signing off


def serialise_rollbacks() -> None:
    """Inside a metadata transaction: wait for a rollback between its two steps (or a
    sign-off, which must not sign numbers a rollback is about to change)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [ROLLBACK_LOCK])


def serialise_reconciliation(request_id: int) -> None:
    """Inside a transaction: wait for whoever is computing, explaining or signing off
    this request's reconciliation."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [RECONCILIATION_LOCK, int(request_id)])
