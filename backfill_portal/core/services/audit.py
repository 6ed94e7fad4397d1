"""Writing the audit log. Called inside the transaction of the change it records."""
from __future__ import annotations

import functools
import hashlib
import json

from django.db import connection, transaction
from django.utils import timezone

from backfill_portal.core.models import AuditEvent
from backfill_portal.core.rows import insert_row

GENESIS_HASH = "0" * 64
# Any constant works; it only has to be the same for every writer.
_AUDIT_LOCK_KEY = 7_351_001


def actor_label(actor) -> str:
    if actor is None:
        return "system"
    return getattr(actor, "username", None) or str(actor)


def event_hash(prev_hash: str, fields: dict) -> str:
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256((prev_hash + "|" + canonical).encode()).hexdigest()


def hashed_fields(event: AuditEvent) -> dict:
    return {
        "at": event.at.isoformat(),
        "actor_id": event.actor_id,
        "actor_name": event.actor_name,
        "action": event.action,
        "object_type": event.object_type,
        "object_id": str(event.object_id),
        "request_id": event.request_id,
        "dataset": event.dataset,
        "from_state": event.from_state,
        "to_state": event.to_state,
        "reason": event.reason,
        "data": event.data,
    }


def audit_record(
    *,
    actor,
    action: str,
    object_type: str,
    object_id,
    request_id: int | None = None,
    dataset: str = "",
    from_state: str = "",
    to_state: str = "",
    reason: str = "",
    data: dict | None = None,
) -> AuditEvent:
    """Append one event, chained to the previous one.

    Writers serialise on the chain head: SQLite's IMMEDIATE transactions already do,
    PostgreSQL takes a transaction-scoped advisory lock. No savepoint of its own: the
    event belongs to the caller's transaction, and a failure here must undo the change
    it records.
    """
    with transaction.atomic(savepoint=False):
        prev = _chain_head()
        event = AuditEvent(
            at=timezone.now(),
            actor=actor if getattr(actor, "pk", None) else None,
            actor_name=actor_label(actor),
            action=action,
            object_type=object_type,
            object_id=str(object_id),
            request_id=request_id,
            dataset=dataset or "",
            from_state=from_state or "",
            to_state=to_state or "",
            reason=reason or "",
            data=json.loads(json.dumps(data or {}, default=str)),
            prev_hash=prev,
        )
        event.hash = event_hash(prev, hashed_fields(event))
        _insert(event)
        _remember_head(event.hash)
    return event


def _insert(event: AuditEvent) -> None:
    """Insert a new event (never an update: the log is append-only), with a statement
    built once per process (the ORM compiled it again for every event, a dozen per
    backfill interval)."""
    insert_row(event)


def _chain_head() -> str:
    """The hash to chain to, with the chain locked until this transaction ends.

    A transaction that already appended an event holds the lock and knows the head
    (the event it wrote), so it neither locks nor reads again. It knows that only while
    the marker callback `_remember_head` registered is still pending in this
    transaction: Django drops pending callbacks when the transaction or a savepoint
    around the write rolls back, and runs them (forgetting the head) on commit."""
    remembered = _remembered()
    if remembered is not None:
        return remembered[1]
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_AUDIT_LOCK_KEY])
    with connection.cursor() as cursor:
        cursor.execute(_head_statement(connection.vendor))
        row = cursor.fetchone()
    return row[0] if row else GENESIS_HASH


@functools.lru_cache(maxsize=4)
def _head_statement(vendor: str) -> str:
    """The chain head's hash, as a fixed statement (it runs once per audited transaction)."""
    quote = connection.ops.quote_name
    return f"SELECT {quote('hash')} FROM {quote(AuditEvent._meta.db_table)} ORDER BY {quote('id')} DESC LIMIT 1"


def _remember_head(head: str) -> None:
    """Remember the event just written as the head, under a marker registered at the
    current savepoint depth: if a savepoint around this write rolls back, the marker
    goes with it and the next writer reads the head again."""
    remembered = _remembered(at_this_depth=True)
    if remembered is not None:
        connection._audit_head = (remembered[0], head)
        return

    def forget() -> None:
        if getattr(connection, "_audit_head", (None,))[0] is forget:
            connection._audit_head = None

    connection._audit_head = (forget, head)
    transaction.on_commit(forget)


def _remembered(*, at_this_depth: bool = False):
    """The remembered (marker, head) while its marker is still pending in this
    transaction (registered at the current savepoint depth, if asked); else None."""
    remembered = getattr(connection, "_audit_head", None)
    if remembered is None:
        return None
    depth = set(connection.savepoint_ids)
    for sids, func, _ in connection.run_on_commit:
        if func is remembered[0] and (not at_this_depth or sids == depth):
            return remembered
    return None


def audit_verify() -> tuple[int, AuditEvent | None]:
    """Walk the chain in id order. Returns (events checked, first broken event or None)."""
    prev = GENESIS_HASH
    checked = 0
    for event in AuditEvent.objects.order_by("id").iterator(chunk_size=2000):
        if event.prev_hash != prev or event.hash != event_hash(prev, hashed_fields(event)):
            return checked, event
        prev = event.hash
        checked += 1
    return checked, None
