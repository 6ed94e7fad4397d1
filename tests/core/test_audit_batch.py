"""audit_batch: a transaction's audit events written by one INSERT at the end of the
batch, executed for all of them in one round trip, chained and signed in Python, and
still in the transaction of the change they record."""
from __future__ import annotations

import re
import threading

import pytest
from django.contrib.auth.models import User
from django.db import DatabaseError, connection, connections, transaction
from django.test.utils import CaptureQueriesContext

from backfill_portal.core.models import AuditEvent
from backfill_portal.core.services.audit import (
    AuditBatchError,
    audit_batch,
    audit_check,
    audit_record,
    audit_serialise,
    audit_verify,
    event_mac,
    hashed_fields,
)

TABLE = AuditEvent._meta.db_table


def actions() -> list[str]:
    return list(AuditEvent.objects.order_by("id").values_list("action", flat=True))


def audit_statements(queries) -> list[str]:
    """The first word of each statement on the log (or the chain's lock); a statement
    executed for many rows at once (Django logs it as "N times: ...") counts once."""
    return [re.sub(r"^\d+ times: ", "", q["sql"]).split()[0] for q in queries
            if TABLE in q["sql"] or "pg_advisory_xact_lock" in q["sql"]]


def assert_chain_whole(settings) -> None:
    """Ids one after another from the first, each signed over the one before."""
    events = list(AuditEvent.objects.order_by("id"))
    assert [e.pk for e in events] == list(range(events[0].pk, events[0].pk + len(events)))
    prev = "0" * 64
    for event in events:
        assert event.prev_hash == prev
        assert event.hash == event_mac(prev, hashed_fields(event), event_id=event.pk, key_id=event.key_id,
                                       key=settings.AUDIT_KEYS[event.key_id].encode())
        prev = event.hash
    assert audit_verify() == (len(events), None)
    assert audit_check().intact


def test_a_batch_writes_its_events_in_one_insert_after_one_head_read(db, settings):
    with CaptureQueriesContext(connection) as queries, transaction.atomic(), audit_batch():
        for n in range(3):
            event = audit_record(actor=None, action=f"t.batched{n}", object_type="t", object_id=n)
            assert event.pk is None  # numbered when the batch ends
    lock = ["SELECT"] if connection.vendor == "postgresql" else []
    assert audit_statements(queries.captured_queries) == [*lock, "SELECT", "INSERT"]
    assert actions() == ["t.batched0", "t.batched1", "t.batched2"]
    assert event.pk == AuditEvent.objects.order_by("id").last().pk and not event._state.adding
    assert_chain_whole(settings)


def test_the_chain_lock_taken_inside_a_batch_still_leaves_one_insert(db, settings):
    """audit_serialise takes the lock (and reads the head) before a read that must come
    after it; the batch then appends after that head, without writing its events twice."""
    with CaptureQueriesContext(connection) as queries, transaction.atomic(), audit_batch():
        audit_record(actor=None, action="t.one", object_type="t", object_id=1)
        audit_serialise()
        audit_serialise()
        audit_record(actor=None, action="t.two", object_type="t", object_id=2)
    lock = ["SELECT"] if connection.vendor == "postgresql" else []
    assert audit_statements(queries.captured_queries) == [*lock, "SELECT", "INSERT"]
    assert actions() == ["t.one", "t.two"]
    assert_chain_whole(settings)


def test_more_events_than_one_insert_holds_stay_one_chain(db, settings):
    with transaction.atomic(), audit_batch():
        for n in range(123):
            audit_record(actor=None, action="t.many", object_type="t", object_id=n, data={"n": n})
    assert AuditEvent.objects.count() == 123
    assert list(AuditEvent.objects.order_by("id").values_list("data__n", flat=True)) == list(range(123))
    assert_chain_whole(settings)


def test_events_of_a_savepoint_that_rolls_back_are_not_written(db, settings):
    with transaction.atomic(), audit_batch():
        audit_record(actor=None, action="t.one", object_type="t", object_id=1)
        with pytest.raises(RuntimeError), transaction.atomic():
            audit_record(actor=None, action="t.gone", object_type="t", object_id=2)
            with transaction.atomic():
                audit_record(actor=None, action="t.gone.deeper", object_type="t", object_id=3)
            raise RuntimeError("undo this savepoint")
        with transaction.atomic():
            audit_record(actor=None, action="t.two", object_type="t", object_id=4)  # released: kept
        with audit_batch():  # a nested batch joins the outer one
            audit_record(actor=None, action="t.three", object_type="t", object_id=5)
        assert AuditEvent.objects.filter(action="t.two").exists()  # a read of the log sees them
        audit_record(actor=None, action="t.four", object_type="t", object_id=6)
    assert actions() == ["t.one", "t.two", "t.three", "t.four"]
    assert_chain_whole(settings)


def test_a_batch_rolled_back_with_its_savepoint_leaves_no_head_remembered(db, settings):
    """The batch wrote its events inside a savepoint that then rolled back: the next
    event of the transaction reads the head again instead of chaining to them."""
    with transaction.atomic():
        audit_record(actor=None, action="t.one", object_type="t", object_id=1)
        with pytest.raises(RuntimeError), transaction.atomic():
            with audit_batch():
                audit_record(actor=None, action="t.gone", object_type="t", object_id=2)
                audit_record(actor=None, action="t.gone", object_type="t", object_id=3)
            raise RuntimeError("undo the written batch")
        with audit_batch():
            audit_record(actor=None, action="t.two", object_type="t", object_id=4)
        audit_record(actor=None, action="t.three", object_type="t", object_id=5)
    assert actions() == ["t.one", "t.two", "t.three"]
    assert_chain_whole(settings)


@pytest.fixture
def refused_action(db):
    """A trigger that refuses to store events of action `t.refused`: a real failure of
    the batch's INSERT."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("CREATE FUNCTION test_refuse_event() RETURNS trigger AS $$ BEGIN "
                           "IF NEW.action = 't.refused' THEN RAISE EXCEPTION 'refused'; END IF; RETURN NEW; END "
                           "$$ LANGUAGE plpgsql")
            cursor.execute(f"CREATE TRIGGER test_refuse_event BEFORE INSERT ON {TABLE} FOR EACH ROW "
                           "EXECUTE FUNCTION test_refuse_event()")
        else:
            cursor.execute(f"CREATE TRIGGER test_refuse_event BEFORE INSERT ON {TABLE} "
                           "WHEN NEW.action = 't.refused' BEGIN SELECT RAISE(ABORT, 'refused'); END")
    return "t.refused"


def test_a_failure_writing_the_batch_undoes_the_change_it_records(refused_action):
    with pytest.raises(DatabaseError), transaction.atomic(), audit_batch():
        User.objects.create(username="recorded")
        audit_record(actor=None, action="t.fine", object_type="user", object_id="recorded")
        audit_record(actor=None, action=refused_action, object_type="user", object_id="recorded")
    assert not User.objects.filter(username="recorded").exists()
    assert AuditEvent.objects.count() == 0


def test_an_error_caught_inside_the_transaction_still_writes_the_events_of_what_it_keeps(db, settings):
    with transaction.atomic():
        with pytest.raises(ValueError), audit_batch():
            User.objects.create(username="kept")
            audit_record(actor=None, action="user.created", object_type="user", object_id="kept")
            raise ValueError("caught by the caller, whose transaction commits")
    assert User.objects.filter(username="kept").exists()
    assert actions() == ["user.created", "user.created"]  # core.role_audit's, then this test's own
    assert_chain_whole(settings)


def test_a_batch_whose_writing_fails_on_the_error_path_rolls_the_transaction_back(refused_action):
    with transaction.atomic():
        with pytest.raises(ValueError), audit_batch():
            User.objects.create(username="recorded")
            audit_record(actor=None, action=refused_action, object_type="user", object_id="recorded")
            raise ValueError("caught by the caller")
    assert not User.objects.filter(username="recorded").exists()


@pytest.mark.django_db(transaction=True)
def test_a_batch_needs_the_transaction_of_its_changes():
    with pytest.raises(AuditBatchError), audit_batch():
        pass


def test_reading_the_log_inside_a_later_savepoint_is_refused(db):
    """Writing the waiting events there would put them inside a savepoint their change
    is not in: if it rolled back, the change would stay without its events."""
    with transaction.atomic(), audit_batch():
        audit_record(actor=None, action="t.one", object_type="t", object_id=1)
        with pytest.raises(AuditBatchError), transaction.atomic():
            AuditEvent.objects.count()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor != "postgresql",
                    reason="concurrent writers need PostgreSQL: the SQLite test database is in memory, shared by "
                           "threads without a busy timeout (a file database queues writers: IMMEDIATE)")
def test_concurrent_batched_and_single_writers_keep_one_chain_without_gaps(settings):
    errors, start = [], threading.Barrier(4)

    def batched(name: str) -> None:
        try:
            start.wait(10)
            for n in range(15):
                with transaction.atomic(), audit_batch():
                    for k in range(3):
                        audit_record(actor=None, action=f"t.{name}", object_type="t", object_id=f"{n}.{k}")
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    def single(name: str) -> None:
        try:
            start.wait(10)
            for n in range(30):
                audit_record(actor=None, action=f"t.{name}", object_type="t", object_id=n)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=batched, args=("a",)), threading.Thread(target=batched, args=("b",)),
               threading.Thread(target=single, args=("c",)), threading.Thread(target=single, args=("d",))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert AuditEvent.objects.count() == 2 * 45 + 2 * 30
    # Each batch's events are consecutive: one transaction's, under the chain's lock.
    rows = list(AuditEvent.objects.filter(action__in=["t.a", "t.b"]).order_by("id").values_list("id", "action"))
    for i in range(0, len(rows), 3):
        group = rows[i:i + 3]
        assert len({a for _, a in group}) == 1 and group[-1][0] - group[0][0] == 2, group
    assert_chain_whole(settings)
