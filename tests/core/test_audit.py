"""The audit log: append-only in the ORM, hash-chained against edits behind its back,
and readable through a filtered, cursor-paginated API."""
from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import DatabaseError, connection, transaction

from backfill_portal.backfills.services.requests import backfill_request_create, backfill_request_submit
from backfill_portal.core.models import AppendOnlyError, AuditEvent
from backfill_portal.core.services.audit import audit_record, audit_verify


@pytest.fixture
def activity(alice, sam, catalog):
    """A few real actions on top of the catalog sync: two requests, one submitted."""
    first, _ = backfill_request_create(actor=alice, job="dwd_order_items", start="2022-10-01", end="2022-10-03",
                                       reason="late events")
    backfill_request_submit(actor=alice, request_id=first.pk)
    second, _ = backfill_request_create(actor=sam, job="dws_sales_daily", start="2022-10-01", end="2022-10-02",
                                        reason="rebuild after fix")
    return first, second


# --- append-only -----------------------------------------------------------------------------


def test_saving_an_existing_event_is_refused(activity):
    event = AuditEvent.objects.order_by("id").first()
    event.reason = "rewritten history"
    with pytest.raises(AppendOnlyError):
        event.save()
    assert AuditEvent.objects.get(pk=event.pk).reason != "rewritten history"


def test_deleting_an_event_is_refused(activity):
    event = AuditEvent.objects.order_by("id").first()
    with pytest.raises(AppendOnlyError):
        event.delete()
    assert AuditEvent.objects.filter(pk=event.pk).exists()


def test_queryset_update_and_delete_are_refused(activity):
    before = AuditEvent.objects.count()
    with pytest.raises(AppendOnlyError):
        AuditEvent.objects.update(reason="x")
    with pytest.raises(AppendOnlyError):
        AuditEvent.objects.filter(actor_name="alice").update(reason="x")
    with pytest.raises(AppendOnlyError):
        AuditEvent.objects.all().delete()
    with pytest.raises(AppendOnlyError):
        AuditEvent.objects.filter(actor_name="alice").delete()
    assert AuditEvent.objects.count() == before
    assert not AuditEvent.objects.filter(reason="x").exists()


def test_bulk_update_is_refused(activity):
    events = list(AuditEvent.objects.all()[:2])
    for e in events:
        e.reason = "x"
    # bulk_update opens atomic(savepoint=False); our savepoint keeps the test's transaction usable.
    with pytest.raises(AppendOnlyError), transaction.atomic():
        AuditEvent.objects.bulk_update(events, ["reason"])
    assert not AuditEvent.objects.filter(reason="x").exists()


def test_each_event_chains_to_the_one_before(activity):
    events = list(AuditEvent.objects.order_by("id"))
    assert len(events) > 5
    for before, after in zip(events, events[1:]):
        assert after.prev_hash == before.hash


def tamper(sql: str, params: list) -> None:
    """Change the log behind the application's back. On PostgreSQL a trigger refuses
    UPDATE and DELETE, so play someone with the table owner's rights switching it off
    (inside the test's transaction, so it is rolled back with it)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # ALTER TABLE refuses while deferred FK checks of this transaction are pending.
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
            cursor.execute("ALTER TABLE core_auditevent DISABLE TRIGGER core_auditevent_append_only")
        cursor.execute(sql, params)
        if connection.vendor == "postgresql":
            cursor.execute("ALTER TABLE core_auditevent ENABLE TRIGGER core_auditevent_append_only")
            cursor.execute("SET CONSTRAINTS ALL DEFERRED")


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the append-only trigger exists on PostgreSQL only")
@pytest.mark.parametrize("sql", ["UPDATE core_auditevent SET reason='x' WHERE id=%s",
                                 "DELETE FROM core_auditevent WHERE id=%s"])
def test_postgresql_refuses_raw_sql_edits_of_the_log(activity, sql):
    event = AuditEvent.objects.order_by("id").first()
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql, [event.pk])
    assert AuditEvent.objects.get(pk=event.pk).reason == event.reason


# --- verify_audit ------------------------------------------------------------------------------


def test_verify_audit_passes_on_an_untouched_log(activity):
    out = StringIO()
    call_command("verify_audit", stdout=out)
    total = AuditEvent.objects.count()
    assert f"{total} event(s) verified" in out.getvalue()
    assert audit_verify() == (total, None)


def test_verify_audit_passes_on_an_empty_log(db):
    out = StringIO()
    call_command("verify_audit", stdout=out)
    assert "0 event(s) verified" in out.getvalue()


def test_verify_audit_names_an_event_edited_with_raw_sql(activity):
    ids = list(AuditEvent.objects.order_by("id").values_list("id", flat=True))
    target = ids[len(ids) // 2]
    tamper("UPDATE core_auditevent SET reason='x' WHERE id=%s", [target])
    with pytest.raises(CommandError) as exc:
        call_command("verify_audit", stdout=StringIO())
    assert f"#{target} " in str(exc.value)
    assert f"{ids.index(target)} event(s) before it verify" in str(exc.value)


def test_verify_audit_notices_an_edit_of_the_last_event(activity):
    last = AuditEvent.objects.order_by("-id").values_list("id", flat=True).first()
    tamper("UPDATE core_auditevent SET actor_name='mallory' WHERE id=%s", [last])
    with pytest.raises(CommandError) as exc:
        call_command("verify_audit", stdout=StringIO())
    assert f"#{last} " in str(exc.value)


def test_verify_audit_notices_a_row_deleted_with_raw_sql(activity):
    ids = list(AuditEvent.objects.order_by("id").values_list("id", flat=True))
    gone, successor = ids[2], ids[3]
    tamper("DELETE FROM core_auditevent WHERE id=%s", [gone])
    with pytest.raises(CommandError) as exc:
        call_command("verify_audit", stdout=StringIO())
    assert f"#{successor} " in str(exc.value)


def test_verify_audit_notices_a_rehashed_edit(activity):
    """Recomputing the edited row's own hash is not enough: the next link breaks."""
    from backfill_portal.core.services.audit import event_hash, hashed_fields

    ids = list(AuditEvent.objects.order_by("id").values_list("id", flat=True))
    target = AuditEvent.objects.get(pk=ids[1])
    target.reason = "forged"
    forged = event_hash(target.prev_hash, hashed_fields(target))
    tamper("UPDATE core_auditevent SET reason='forged', hash=%s WHERE id=%s", [forged, target.pk])
    with pytest.raises(CommandError) as exc:
        call_command("verify_audit", stdout=StringIO())
    assert f"#{ids[2]} " in str(exc.value)


def test_events_with_awkward_data_still_verify(db):
    from decimal import Decimal

    audit_record(actor=None, action="test.awkward", object_type="test", object_id=1,
                 data={"amount": Decimal("12.30"), "nested": {"b": 1, "a": [1.5, None, "ü"]}, "when": None})
    audit_record(actor=None, action="test.plain", object_type="test", object_id=2, reason="multi\nline")
    assert audit_verify() == (2, None)


# --- the audit API ---------------------------------------------------------------------------


def results(response) -> list[dict]:
    assert response.status_code == 200, response.content
    return response.json()["results"]


def test_audit_api_filters_by_request(api, activity):
    first, second = activity
    rows = results(api("audrey").get("/api/audit/", {"request": first.pk}))
    assert rows and all(r["request_id"] == first.pk for r in rows)
    assert {"request.create", "request.submit"} <= {r["action"] for r in rows}
    assert len(rows) == AuditEvent.objects.filter(request_id=first.pk).count()


def test_audit_api_filters_by_actor(api, activity):
    rows = results(api("audrey").get("/api/audit/", {"actor": "sam"}))
    assert rows and all(r["actor"] == "sam" for r in rows)
    assert len(rows) == AuditEvent.objects.filter(actor_name="sam").count()


def test_audit_api_filters_by_action_prefix(api, activity):
    rows = results(api("audrey").get("/api/audit/", {"action": "request."}))
    assert {r["action"] for r in rows} == {"request.create", "request.submit"}
    rows = results(api("audrey").get("/api/audit/", {"action": "catalog"}))
    assert rows and all(r["action"].startswith("catalog.") for r in rows)


def test_audit_api_filters_by_time_window(api, activity):
    events = list(AuditEvent.objects.order_by("id"))
    # Timestamps can tie within a clock tick; pick a boundary where they do not.
    boundary = next(e for prev, e in zip(events, events[1:]) if e.at > prev.at)
    after = {e.pk for e in events if e.at >= boundary.at}
    before = {e.pk for e in events if e.at < boundary.at}
    assert after and before

    rows = results(api("audrey").get("/api/audit/", {"since": boundary.at.isoformat(), "page_size": 500}))
    assert {r["id"] for r in rows} == after
    rows = results(api("audrey").get("/api/audit/", {"until": boundary.at.isoformat(), "page_size": 500}))
    assert {r["id"] for r in rows} == before
    rows = results(api("audrey").get("/api/audit/", {
        "since": (boundary.at - timedelta(days=1)).isoformat(),
        "until": (boundary.at - timedelta(hours=12)).isoformat(),
    }))
    assert rows == []


def test_audit_api_rejects_a_bad_datetime(api, activity):
    response = api("audrey").get("/api/audit/", {"since": "last tuesday"})
    assert response.status_code == 400
    assert "since" in response.json()["errors"]


def test_audit_api_is_cursor_paginated(api, activity):
    total = AuditEvent.objects.count()
    assert total > 6
    client = api("audrey")
    response = client.get("/api/audit/", {"page_size": 3})
    seen: list[int] = []
    pages = 0
    while True:
        assert response.status_code == 200
        body = response.json()
        assert "cursor=" in (body["next"] or "cursor=")
        assert "count" not in body  # keyset pagination: no COUNT(*)
        assert len(body["results"]) <= 3
        seen += [r["id"] for r in body["results"]]
        pages += 1
        if not body["next"]:
            break
        response = client.get(body["next"])
    assert seen == sorted(seen, reverse=True)  # newest first
    assert len(seen) == len(set(seen)) == total
    assert pages == -(-total // 3)


def test_audit_api_is_read_only(api, activity):
    event = AuditEvent.objects.order_by("id").first()
    assert api("admin").delete(f"/api/audit/{event.pk}/").status_code == 405
    assert api("admin").patch(f"/api/audit/{event.pk}/", {"reason": "x"}, format="json").status_code == 405
    assert api("admin").post("/api/audit/", {"action": "x"}, format="json").status_code == 405
    assert AuditEvent.objects.get(pk=event.pk).reason == event.reason


def test_the_chain_stays_whole_across_savepoints_within_one_transaction(db):
    """A transaction that appended an event chains the next one to it without locking
    or reading again; a savepoint rolled back around an event makes the next writer
    read the head from the table again, so no event chains to a vanished one."""
    from django.test.utils import CaptureQueriesContext

    with transaction.atomic():
        audit_record(actor=None, action="t.one", object_type="t", object_id=1)
        with CaptureQueriesContext(connection) as second:
            audit_record(actor=None, action="t.two", object_type="t", object_id=2)
        with pytest.raises(RuntimeError):
            with transaction.atomic():
                audit_record(actor=None, action="t.gone", object_type="t", object_id=3)
                raise RuntimeError("undo this savepoint")
        audit_record(actor=None, action="t.three", object_type="t", object_id=4)
        with transaction.atomic():
            audit_record(actor=None, action="t.four", object_type="t", object_id=5)
        audit_record(actor=None, action="t.five", object_type="t", object_id=6)

    assert [q["sql"].split()[0] for q in second.captured_queries] == ["INSERT"]
    assert list(AuditEvent.objects.order_by("id").values_list("action", flat=True)) == [
        "t.one", "t.two", "t.three", "t.four", "t.five"]
    assert audit_verify() == (5, None)


def test_an_event_is_stored_exactly_as_returned_and_hashed(alice):
    """audit_record writes with its own INSERT: every field must land as the model
    would have stored it (actor, aware timestamp, JSON data), with the id returned."""
    event = audit_record(actor=alice, action="request.created", object_type="request", object_id=41,
                         request_id=41, dataset="dwd_order_items", from_state="", to_state="draft",
                         reason="late events", data={"n": 3, "nested": {"ok": True}, "when": timedelta(hours=1)})
    stored = AuditEvent.objects.get(pk=event.pk)
    assert not event._state.adding
    for field in AuditEvent._meta.concrete_fields:
        assert getattr(stored, field.attname) == getattr(event, field.attname), field.name
    assert stored.actor_id == alice.pk and stored.data == {"n": 3, "nested": {"ok": True}, "when": "1:00:00"}
    assert stored.at.tzinfo is not None
    assert audit_verify()[1] is None
