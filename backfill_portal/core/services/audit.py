"""Writing and proving the audit log. Events are written inside the transaction of the
change they record.

The chain: an event's `hash` is an HMAC-SHA256, under the audit key its `key_id`
names, of its id, the previous event's hash and its fields. Keys come from the
environment (AUDIT_KEY, AUDIT_OLD_KEYS), never from the database, so its owner can
edit rows but not sign them. Ids are given out one after another under the chain's
lock, so a missing event is a missing id. Events from before the key (key_id '') keep
their plain SHA-256 links and are accepted only as the chain's first events: the
first keyed event signs their head. The head is anchored outside the database
(`audit_anchor`, core/services/audit_anchors.py); `audit_check` compares the chain
with the newest anchor, so a log cut short or emptied is named by its first missing id.
"""
from __future__ import annotations

import functools
import hashlib
import hmac
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db import connection, transaction
from django.db.models import QuerySet, TextField
from django.db.models.functions import Cast
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from backfill_portal.core.locks import shared_lock
from backfill_portal.core.models import AuditEvent
from backfill_portal.core.rows import insert_row, insert_rows
from backfill_portal.core.services.audit_anchors import Anchor, AnchorFileError, anchor_append, anchors_read, signing_key

GENESIS_HASH = "0" * 64
# Any constant works; it only has to be the same for every writer.
_AUDIT_LOCK_KEY = 7_351_001


class AuditChainBroken(Exception):
    """The chain does not verify; the message is one line naming where."""


def actor_label(actor) -> str:
    if actor is None:
        return "system"
    return getattr(actor, "username", None) or str(actor)


def event_hash(prev_hash: str, fields: dict) -> str:
    """The unkeyed SHA-256 link of the events written before the chain was keyed."""
    return hashlib.sha256((prev_hash + "|" + _canonical(fields)).encode()).hexdigest()


def event_mac(prev_hash: str, fields: dict, *, event_id: int, key_id: str, key: bytes) -> str:
    """The keyed link: HMAC-SHA256 of the event's id, its key id, the hash before it and
    its fields. The id is signed too, so moving an event leaves a trace."""
    message = f"{event_id}|{key_id}|{prev_hash}|{_canonical(fields)}"
    return hmac.new(key, message.encode(), hashlib.sha256).hexdigest()


def _canonical(fields: dict) -> str:
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), default=str)


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
    it records. Inside an `audit_batch` the event waits in the batch and is numbered,
    signed and written when the batch ends, still in the caller's transaction (its id
    and hash are set then).
    """
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
    )
    batch = getattr(connection, "_audit_batch", None)
    if batch is not None:
        batch.add(event)
        return event
    with transaction.atomic(savepoint=False):
        _append([event])
    return event


def _append(events: list[AuditEvent]) -> None:
    """Number, chain and sign `events` after the head, then write them in one round
    trip (core.rows.insert_rows) and remember the last as the head. Runs inside the
    caller's transaction."""
    key_id = settings.AUDIT_KEY_ID
    key = signing_key(key_id)
    prev_id, prev = _chain_head()
    for event in events:
        event.id, event.prev_hash, event.key_id = prev_id + 1, prev, key_id
        event.hash = event_mac(prev, hashed_fields(event), event_id=event.id, key_id=key_id, key=key)
        prev_id, prev = event.id, event.hash
    if len(events) == 1:
        _insert(events[0])
    else:
        insert_rows(events)
    _remember_head((prev_id, prev))


class AuditBatchError(RuntimeError):
    """An audit batch used where its events could not be written with their change."""


class _Batch:
    """The events of one `audit_batch`, each with the marker callback it registered
    (`transaction.on_commit`) and the savepoints open when it was recorded. Django
    drops a marker when a savepoint around it rolls back: its event is then dropped."""

    def __init__(self, table: str):
        self.table = table
        self.events: list[tuple[object, tuple, AuditEvent]] = []
        self.flushing = False

    def add(self, event: AuditEvent) -> None:
        def marker() -> None:
            pass

        transaction.on_commit(marker)
        self.events.append((marker, _savepoints(), event))

    def alive(self) -> list[tuple[tuple, AuditEvent]]:
        pending = {func for _, func, _ in connection.run_on_commit}
        return [(sids, event) for marker, sids, event in self.events if marker in pending]

    def flush(self) -> None:
        """Write the events still alive (savepoints that rolled back took theirs)."""
        events = [event for _, event in self.alive()]
        self.events = []
        if events:
            self.flushing = True
            try:
                _append(events)
            finally:
                self.flushing = False

    def before_statement(self, execute, sql, params, many, context):
        """An execute wrapper: a statement that names the audit table while events
        wait here (a read of the log, or a write outside the batch) has them written
        first, so this transaction reads the log as it would have unbatched. Only when
        the statement runs where they were recorded (no savepoint opened since): one
        written inside a later savepoint would vanish with it, and its change stay."""
        if self.events and not self.flushing and self.table in sql:
            here = _savepoints()
            alive = self.alive()
            if any(sids[:len(here)] != here for sids, _ in alive):
                raise AuditBatchError("the audit log was read inside a savepoint while events recorded before it "
                                      "waited in an audit batch; end the batch first")
            self.flush()
        return execute(sql, params, many, context)


def _savepoints() -> tuple:
    """The savepoints open now, outermost first (atomic blocks without one add none)."""
    return tuple(sid for sid in connection.savepoint_ids if sid)


@contextmanager
def audit_batch():
    """Write the audit events recorded in this block in one round trip at its end,
    with one chain lock and head read, instead of an INSERT (and, first in the
    transaction, a lock and a read) per event.

    It must be used inside the transaction of the changes it records (`transaction.
    atomic()`), and it ends before that transaction does, so the events still commit
    with their changes, or not at all: a failure writing them leaves the block with the
    error and the transaction rolls back. Events recorded inside a savepoint that rolls
    back are not written. Nested batches join the outermost one. The chain's lock is
    taken when the events are written, at the end (held for less of the transaction,
    never earlier than unbatched), or where `audit_serialise` asks for it.
    """
    if getattr(connection, "_audit_batch", None) is not None:
        yield
        return
    if not connection.in_atomic_block:
        raise AuditBatchError("audit_batch() must be used inside transaction.atomic(): its events are written "
                              "in the transaction of their changes")
    batch = _Batch(AuditEvent._meta.db_table)
    connection._audit_batch = batch
    try:
        with connection.execute_wrapper(batch.before_statement):
            try:
                yield
            except BaseException:
                # The error may be caught inside the transaction, which then commits:
                # the events of the changes it keeps are written, or it rolls back.
                if batch.events and not connection.needs_rollback:
                    connection._audit_batch = None
                    try:
                        batch.flush()
                    except Exception:
                        connection.set_rollback(True)
                raise
            connection._audit_batch = None
            if connection.needs_rollback:
                return  # the transaction rolls back, and every event with it
            batch.flush()
    finally:
        connection._audit_batch = None


# Rows deleted per transaction (and per audit row) by `delete_audited_in_batches`.
PURGE_BATCH = 5000


def delete_audited_in_batches(rows, *, action: str, object_type: str, counted_as: str, actor=None,
                              reason: str = "", data: dict | None = None, batch: int = PURGE_BATCH) -> int:
    """Delete the rows of the queryset `rows` oldest id first, up to `batch` per
    transaction, each batch with one audit row (how many as `counted_as`, the first and
    last id, plus `data`). The ids are read and deleted by the same filter in one
    transaction, so a row that stopped matching in between stays. Returns how many."""
    purged = 0
    while True:
        with transaction.atomic():
            ids = list(rows.order_by("id").values_list("id", flat=True)[:batch])
            if not ids:
                return purged
            count, _ = rows.filter(pk__in=ids).delete()
            audit_record(actor=actor, action=action, object_type=object_type, object_id=f"{ids[0]}-{ids[-1]}",
                         reason=reason, data={counted_as: count, "first_id": ids[0], "last_id": ids[-1], **(data or {})})
        purged += count
        if len(ids) < batch:
            return purged


def _insert(event: AuditEvent) -> None:
    """Insert a new event with the id the chain gave it (never an update: the log is
    append-only), with a statement built once per process (the ORM compiled it again
    for every event, a dozen per backfill interval)."""
    insert_row(event, with_pk=True)


def audit_serialise() -> None:
    """Take the audit chain's lock now, in this transaction, if an event of it has not
    already (within an `audit_batch` the lock is otherwise taken as the batch ends):
    for a read that must see every transaction that wrote its events before this one
    (the run's failing flag, execution/transitions.py). Held until the transaction ends."""
    if connection.in_atomic_block and _remembered() is None:
        batch = getattr(connection, "_audit_batch", None)
        if batch is not None:
            batch.flushing = True  # the head's read is the chain's own: it writes nothing first
        try:
            _remember_head(_chain_head())
        finally:
            if batch is not None:
                batch.flushing = False


def _chain_head() -> tuple[int, str]:
    """The (id, hash) to chain to, with the chain locked until this transaction ends.

    A transaction that already appended an event holds the lock and knows the head
    (the event it wrote), so it neither locks nor reads again. It knows that only while
    the marker callback `_remember_head` registered is still pending in this
    transaction: Django drops pending callbacks when the transaction or a savepoint
    around the write rolls back, and runs them (forgetting the head) on commit."""
    remembered = _remembered()
    if remembered is not None:
        return remembered[1]
    shared_lock(_AUDIT_LOCK_KEY)
    with connection.cursor() as cursor:
        cursor.execute(_head_statement(connection.vendor))
        row = cursor.fetchone()
    return (row[0], row[1]) if row else (0, GENESIS_HASH)


@functools.lru_cache(maxsize=4)
def _head_statement(vendor: str) -> str:
    """The chain head's id and hash, as a fixed statement (it runs once per audited transaction)."""
    quote = connection.ops.quote_name
    return (f"SELECT {quote('id')}, {quote('hash')} FROM {quote(AuditEvent._meta.db_table)} "
            f"ORDER BY {quote('id')} DESC LIMIT 1")


def _remember_head(head: tuple[int, str]) -> None:
    """Remember the event just written as the head, under a marker registered at the
    current savepoint depth: if a savepoint around this write rolls back, the marker
    goes with it and the next writer reads the head again."""
    remembered = _remembered(at_this_depth=True)
    if remembered is not None:
        connection._audit_head = (remembered[0], head)
        return

    def forget() -> None:
        if (getattr(connection, "_audit_head", None) or (None,))[0] is forget:
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


@dataclass(frozen=True)
class AuditCheck:
    """What a walk of the chain found. `problem` is one line, empty when it holds."""

    checked: int  # events whose links verify, in id order, before any problem
    legacy: int  # of them, the unkeyed events from before the chain was keyed
    last_id: int | None  # the last event that verifies
    last_hash: str
    broken: AuditEvent | None = None  # the first event whose link fails
    first_missing_id: int | None = None
    anchor: Anchor | None = None  # the anchor compared with
    problem: str = ""

    @property
    def intact(self) -> bool:
        return not self.problem

    @property
    def unanchored(self) -> int:
        """Events verified after the anchor's head: no anchor covers them yet, so their
        deletion could not be detected until the next anchor."""
        return max(self.checked - self.anchor.count, 0) if self.anchor is not None and self.intact else 0


def audit_events_read(events: QuerySet, *, chunk_size: int = 2000) -> Iterator[AuditEvent]:
    """The events of `events` in its order, each one readable whatever its row holds.

    SQLite keeps any text in any column, and Django's reader of a timestamp it cannot
    parse returns None ('garbage', 12345) or raises in the middle of a fetch
    ('2026-13-45 10:00'), losing the rows fetched with it. There `at` is read as text
    and parsed here as Django parses it. An event whose timestamp cannot be read has
    `at` None and the stored text in `at_unreadable` (None when it reads). PostgreSQL's
    typed columns cannot hold such a value, so it is read as it is."""
    if connection.vendor != "sqlite":
        for event in events.iterator(chunk_size=chunk_size):
            event.at_unreadable = None
            yield event
        return
    for event in events.defer("at").annotate(at_text=Cast("at", TextField())).iterator(chunk_size=chunk_size):
        event.at = _stored_datetime(event.at_text)
        event.at_unreadable = None if event.at is not None else str(event.at_text)
        yield event


def audit_events_newest_first(ids) -> list[AuditEvent]:
    """The events of a page of `ids` (the page read by id alone), newest first, read as
    `audit_events_read` reads them: the audit page and the API list a page this way, so
    one edited timestamp does not make the whole page unreadable."""
    return list(audit_events_read(AuditEvent.objects.filter(pk__in=list(ids)).order_by("-id")))


def _stored_datetime(text) -> datetime | None:
    """A timestamp stored by Django's SQLite backend, as it reads one (aware, in the
    connection's time zone), or None when the text is not one."""
    try:
        value = parse_datetime(text) if isinstance(text, str) else None
    except ValueError:
        return None
    if value is not None and settings.USE_TZ and timezone.is_naive(value):
        value = timezone.make_aware(value, connection.timezone)
    return value


def _where(event: AuditEvent) -> str:
    when = f"{event.at:%Y-%m-%d %H:%M:%S}" if event.at_unreadable is None else f"{event.at_unreadable!r}"
    return f"event #{event.pk} ({event.action} by {event.actor_name} at {when})"


def _missing_before_first(event: AuditEvent, anchor: Anchor | None, readable: bool) -> tuple[str, int | None] | None:
    """When the log's first event is not the chain's first: (what is missing, the first
    missing id if known), else None. The anchor records the first id; without one, an
    event whose own link verifies but follows a hash other than the genesis one had
    events before it."""
    if anchor is not None and anchor.first_id is not None and event.pk > anchor.first_id:
        missing = f"#{anchor.first_id}" + (f"..#{event.pk - 1}" if event.pk - 1 > anchor.first_id else "")
        return f"event(s) {missing} missing (first missing id #{anchor.first_id})", anchor.first_id
    if not readable or event.prev_hash == GENESIS_HASH:
        return None
    if event.key_id:
        key = signing_key(event.key_id)
        linked = key is not None and hmac.compare_digest(event.hash, event_mac(
            event.prev_hash, hashed_fields(event), event_id=event.pk, key_id=event.key_id, key=key))
        up_to = f", up to #{event.pk - 1}"  # a keyed event follows the id before it
    else:
        linked, up_to = event.hash == event_hash(event.prev_hash, hashed_fields(event)), ""
    if not linked:
        return None
    return (f"the event(s) before it are missing{up_to} (it is signed as following another; no anchor records "
            "the first id)"), None


def _walk(*, start: Anchor | None = None, until_id: int | None = None, anchor: Anchor | None = None) -> AuditCheck:
    """Walk the chain in id order and stop at the first event that does not verify:
    from an anchor's head (trusted) when `start` is given, up to `until_id` when given,
    checking the event `anchor` names against it on the way."""
    prev_id = start.last_id if start else None
    prev = start.hash if prev_id is not None else GENESIS_HASH
    checked = start.count if start else 0
    legacy, keyed = 0, prev_id is not None
    events = AuditEvent.objects.order_by("id")
    if prev_id is not None:
        events = events.filter(id__gt=prev_id)
    if until_id is not None:
        events = events.filter(id__lte=until_id)

    def stop(event: AuditEvent | None, problem: str, **extra) -> AuditCheck:
        return AuditCheck(checked, legacy, prev_id, prev, broken=event, anchor=anchor, problem=problem, **extra)

    for event in audit_events_read(events):
        where = _where(event)
        # No writer signs a timestamp that is not a time: such a row was edited.
        readable = event.at_unreadable is None
        if prev_id is None and (missing := _missing_before_first(event, anchor, readable)):
            return stop(event, f"audit chain broken at {where}: {missing[0]}; {checked} event(s) before it verify",
                        first_missing_id=missing[1])
        if not event.key_id:
            if keyed:
                return stop(event, f"audit chain broken at {where}: an unkeyed event after keyed ones; "
                                   f"{checked} event(s) before it verify")
            valid = readable and event.prev_hash == prev and event.hash == event_hash(prev, hashed_fields(event))
        else:
            if prev_id is not None and event.pk != prev_id + 1:
                missing = f"#{prev_id + 1}" + (f"..#{event.pk - 1}" if event.pk - 1 > prev_id + 1 else "")
                return stop(event, f"audit chain broken at {where}: event(s) {missing} missing (first missing id "
                                   f"#{prev_id + 1}); {checked} event(s) before it verify",
                            first_missing_id=prev_id + 1)
            key = signing_key(event.key_id)
            if key is None:
                return stop(event, f"audit chain cannot be verified at {where}: it is signed with audit key "
                                   f"{event.key_id!r}, which is not configured (AUDIT_KEY / AUDIT_OLD_KEYS); "
                                   f"{checked} event(s) before it verify")
            valid = readable and event.prev_hash == prev and hmac.compare_digest(
                event.hash, event_mac(prev, hashed_fields(event), event_id=event.pk, key_id=event.key_id, key=key))
            keyed = True
        if not valid:
            altered = "" if readable else ": its timestamp was altered into one that is not a time"
            return stop(event, f"audit chain broken at {where}{altered}; {checked} event(s) before it verify")
        if anchor is not None and event.pk == anchor.last_id and (event.hash, checked + 1) != (anchor.hash, anchor.count):
            return stop(event, f"audit log differs from its anchor of {anchor.when} at {where}: the anchor recorded "
                               f"{anchor.count} event(s) up to it with hash {anchor.hash[:12]}..., the log has "
                               f"{checked + 1} with {event.hash[:12]}...")
        prev_id, prev = event.pk, event.hash
        checked += 1
        legacy += not event.key_id
    if anchor is not None and anchor.last_id is not None and (prev_id is None or prev_id < anchor.last_id):
        first_missing = prev_id + 1 if prev_id is not None else anchor.first_id
        if prev_id is None:
            problem = (f"audit log emptied: it holds no events, but its anchor of {anchor.when} recorded "
                       f"{anchor.count} event(s) #{anchor.first_id}..#{anchor.last_id}; first missing id #{first_missing}")
        else:
            problem = (f"audit log cut short: it ends at event #{prev_id} ({checked} event(s) verify), but its anchor "
                       f"of {anchor.when} recorded {anchor.count} event(s) up to #{anchor.last_id}; "
                       f"first missing id #{first_missing}")
        return stop(None, problem, first_missing_id=first_missing)
    return AuditCheck(checked, legacy, prev_id, prev, anchor=anchor)


def audit_verify() -> tuple[int, AuditEvent | None]:
    """Walk the chain in id order. Returns (events checked, first broken event or None).
    The chain alone: `audit_check` also holds it against the newest anchor."""
    walked = _walk()
    return walked.checked, walked.broken


def audit_check() -> AuditCheck:
    """Walk the whole chain and hold it against the newest anchor: the anchored event
    must still carry the anchored hash and count, and the log must reach it (a log
    cut short, or emptied, is named by its first missing id)."""
    try:
        anchors = anchors_read()
    except AnchorFileError as exc:
        return AuditCheck(0, 0, None, GENESIS_HASH, problem=str(exc))
    return _walk(anchor=anchors[-1] if anchors else None)


def audit_anchor(*, actor=None) -> tuple[Anchor, bool]:
    """Anchor the chain's head outside the database. Returns (the newest anchor, whether
    this call appended it: an unchanged head is not written again).

    1. Read the head (first id, last id, its hash, the count) in one statement, so the
       four agree however many writers append meanwhile.
    2. Verify what was appended since the newest anchor, starting from its head, and
       that the log still holds that head and exactly the events counted: a chain that
       does not verify is never anchored (AuditChainBroken).
    3. Append the signed line to the file and the anchor logger (with the actor).
    """
    try:
        anchors = anchors_read()
    except AnchorFileError as exc:
        raise AuditChainBroken(str(exc)) from None
    newest = anchors[-1] if anchors else None
    first_id, last_id, count, head_hash = _head_summary()
    if newest is not None and newest.last_id is not None:
        still_there = AuditEvent.objects.filter(pk=newest.last_id, hash=newest.hash).exists()
        if not still_there:
            check = audit_check()
            raise AuditChainBroken(check.problem or f"anchored event #{newest.last_id} is no longer in the log")
        walked = _walk(start=newest, until_id=last_id)
    else:
        walked = _walk(until_id=last_id)
    if walked.problem:
        raise AuditChainBroken(walked.problem)
    if walked.checked != count:
        since = f"from the anchor of {newest.when} " if newest else ""
        raise AuditChainBroken(
            f"audit log holds {count} event(s) up to #{last_id}, but its chain {since}counts {walked.checked}: "
            "events were deleted or added behind it (run verify_audit)")
    if newest is not None and (newest.last_id, newest.count) == (last_id, count):
        return newest, False
    anchor = Anchor(first_id=first_id, last_id=last_id, hash=head_hash or GENESIS_HASH, count=count,
                    at=timezone.now().isoformat(), key_id=settings.AUDIT_KEY_ID)
    anchor_append(anchor, actor_name=actor_label(actor))
    return anchor, True


def _head_summary() -> tuple[int | None, int | None, int, str | None]:
    table, quote = connection.ops.quote_name(AuditEvent._meta.db_table), connection.ops.quote_name
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT MIN({quote('id')}), MAX({quote('id')}), COUNT(*), "
                       f"(SELECT {quote('hash')} FROM {table} ORDER BY {quote('id')} DESC LIMIT 1) FROM {table}")
        return cursor.fetchone()
