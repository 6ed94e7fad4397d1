"""The audit log: append-only in the ORM, hash-chained against edits behind its back,
and readable through a filtered, cursor-paginated API."""
from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from backfill_portal.backfills.services.requests import backfill_request_create, backfill_request_submit
from backfill_portal.core.models import AppendOnlyError, AuditEvent
from backfill_portal.core.services.audit import audit_record, audit_verify, event_hash, event_mac, hashed_fields


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


def test_events_are_only_written_by_audit_record(activity):
    """The ORM's own inserts would number an event from the table's sequence, outside
    the chain: refused, so every event is numbered, chained and signed."""
    before = AuditEvent.objects.count()
    fields = dict(at=timezone.now(), actor_name="mallory", action="x", object_type="x", object_id="1",
                  prev_hash="0" * 64, hash="f" * 64)
    with pytest.raises(AppendOnlyError, match="written by core.services.audit.audit_record"):
        AuditEvent(**fields).save()
    with pytest.raises(AppendOnlyError, match="written by core.services.audit.audit_record"):
        AuditEvent.objects.create(**fields)
    with pytest.raises(AppendOnlyError, match="written by core.services.audit.audit_record"):
        AuditEvent.objects.bulk_create([AuditEvent(**fields)])
    assert AuditEvent.objects.count() == before


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


def tamper(sql: str, params: list | None = None) -> None:
    """Change the log behind the application's back. On PostgreSQL triggers refuse
    UPDATE, DELETE and TRUNCATE, so play the table's owner switching them off (inside
    the test's transaction, so it is rolled back with it)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # ALTER TABLE refuses while deferred FK checks of this transaction are pending.
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
            cursor.execute("ALTER TABLE core_auditevent DISABLE TRIGGER USER")
        cursor.execute(sql, params)
        if connection.vendor == "postgresql":
            cursor.execute("ALTER TABLE core_auditevent ENABLE TRIGGER USER")
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


def test_verify_audit_names_a_row_rehashed_without_the_key(activity):
    """Recomputing the edited row's hash with plain SHA-256, as the unkeyed chain
    allowed, no longer passes for the row itself: without the key it cannot be signed."""
    ids = list(AuditEvent.objects.order_by("id").values_list("id", flat=True))
    target = AuditEvent.objects.get(pk=ids[1])
    target.reason = "forged"
    forged = event_hash(target.prev_hash, hashed_fields(target))
    tamper("UPDATE core_auditevent SET reason='forged', hash=%s WHERE id=%s", [forged, target.pk])
    with pytest.raises(CommandError) as exc:
        call_command("verify_audit", stdout=StringIO())
    assert f"#{ids[1]} " in str(exc.value)


def test_verify_audit_notices_a_row_resigned_with_a_stolen_key(activity, settings):
    """Even re-signing the edited row with the key is not enough: the next link breaks."""
    ids = list(AuditEvent.objects.order_by("id").values_list("id", flat=True))
    target = AuditEvent.objects.get(pk=ids[1])
    target.reason = "forged"
    forged = event_mac(target.prev_hash, hashed_fields(target), event_id=target.pk, key_id=target.key_id,
                       key=settings.AUDIT_KEYS[target.key_id].encode())
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


def test_audit_api_shows_each_event_with_its_link_and_key_id(api, activity, settings):
    """Enough to check a link outside the portal, given the key: hash, prev_hash, key_id."""
    event = AuditEvent.objects.order_by("-id").first()
    row = results(api("audrey").get("/api/audit/", {"page_size": 1}))[0]
    assert (row["id"], row["hash"], row["prev_hash"], row["key_id"]) == (
        event.pk, event.hash, event.prev_hash, settings.AUDIT_KEY_ID)


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


# --- the keyed chain, its anchors, and the database owner ----------------------------------


@pytest.fixture
def history(activity):
    """The activity plus 25 more events: a log with a tail worth cutting."""
    for n in range(25):
        audit_record(actor=None, action="test.filler", object_type="test", object_id=n)
    return list(AuditEvent.objects.order_by("id").values_list("id", flat=True))


def anchor() -> str:
    out = StringIO()
    call_command("anchor_audit", stdout=out)
    return out.getvalue()


def verify_fails() -> str:
    with pytest.raises(CommandError) as exc:
        call_command("verify_audit", stdout=StringIO())
    message = str(exc.value)
    assert "\n" not in message
    return message


def test_every_event_is_signed_with_the_configured_key_and_numbered_without_gaps(db, settings):
    audit_record(actor=None, action="t.one", object_type="t", object_id=1)
    with pytest.raises(RuntimeError), transaction.atomic():
        audit_record(actor=None, action="t.gone", object_type="t", object_id=2)
        raise RuntimeError("roll the event back")
    audit_record(actor=None, action="t.two", object_type="t", object_id=3)
    events = list(AuditEvent.objects.order_by("id"))
    assert [e.action for e in events] == ["t.one", "t.two"]
    assert events[1].pk == events[0].pk + 1  # a rolled-back event leaves no hole
    for prev, event in zip([None, *events], events):
        assert event.key_id == settings.AUDIT_KEY_ID
        key = settings.AUDIT_KEYS[event.key_id].encode()
        assert event.hash == event_mac(prev.hash if prev else "0" * 64, hashed_fields(event), event_id=event.pk,
                                       key_id=event.key_id, key=key)
        assert event.hash != event_hash(event.prev_hash, hashed_fields(event))


def test_a_different_key_does_not_verify_the_chain(activity, settings):
    """The key is the whole protection: the same rows under another key are a broken chain."""
    settings.AUDIT_KEYS = {settings.AUDIT_KEY_ID: "another-secret-of-at-least-32-characters"}
    first = AuditEvent.objects.order_by("id").first()
    assert audit_verify() == (0, first)
    assert f"#{first.pk} " in verify_fails()


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the TRUNCATE trigger exists on PostgreSQL only")
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("sql", ["TRUNCATE core_auditevent", "TRUNCATE TABLE core_auditevent RESTART IDENTITY CASCADE",
                                 "TRUNCATE auth_user, core_auditevent CASCADE"])
def test_postgresql_refuses_truncate_of_the_log_to_its_owner(activity, sql):
    """The owner (here a superuser, who owns the tables) at a SQL prompt of its own."""
    import psycopg

    before = AuditEvent.objects.count()
    db = connection.settings_dict
    with psycopg.connect(host=db["HOST"] or "127.0.0.1", port=db["PORT"] or 5432, user=db["USER"] or "postgres",
                         dbname=db["NAME"], autocommit=True) as owner:
        assert owner.execute("SELECT relowner::regrole::text = current_user FROM pg_class "
                             "WHERE relname = 'core_auditevent'").fetchone() == (True,)
        with pytest.raises(psycopg.errors.RaiseException, match="append-only: TRUNCATE refused"):
            owner.execute(sql)
    assert AuditEvent.objects.count() == before


def test_anchor_audit_appends_the_chain_head_once_per_change(history, audit_anchor_path, caplog):
    assert "anchored: %d event(s) up to #%d" % (len(history), history[-1]) in anchor()
    assert "anchor unchanged" in anchor()
    lines = audit_anchor_path.read_text().splitlines()
    assert len(lines) == 1
    head = AuditEvent.objects.get(pk=history[-1])
    assert json.loads(lines[0]) | {"at": None, "mac": None} == {
        "first_id": history[0], "last_id": head.pk, "hash": head.hash, "count": len(history),
        "key_id": head.key_id, "at": None, "mac": None}
    assert any(r.name == "backfill_portal.audit.anchor" and lines[0] in r.getMessage() for r in caplog.records)

    audit_record(actor=None, action="test.later", object_type="test", object_id=99)
    anchor()
    assert len(audit_anchor_path.read_text().splitlines()) == 2
    out = StringIO()
    call_command("verify_audit", stdout=out)
    assert f"matches its anchor of" in out.getvalue() and f"({len(history) + 1} event(s) up to #{history[-1] + 1})" \
        in out.getvalue()


def test_verify_audit_reports_the_newest_20_events_deleted_with_their_first_missing_id(history):
    anchor()
    cut = history[-20]
    tamper("DELETE FROM core_auditevent WHERE id >= %s", [cut])
    assert audit_verify() == (len(history) - 20, None)  # what is left is a whole chain
    message = verify_fails()
    assert message.startswith("audit log cut short")
    assert f"first missing id #{cut}" in message and f"up to #{history[-1]}" in message


def test_verify_audit_reports_an_emptied_log_with_its_first_missing_id(history):
    anchor()
    tamper("TRUNCATE core_auditevent" if connection.vendor == "postgresql" else "DELETE FROM core_auditevent")
    assert AuditEvent.objects.count() == 0
    message = verify_fails()
    assert message.startswith("audit log emptied") and f"first missing id #{history[0]}" in message


def test_verify_audit_names_the_id_of_an_event_deleted_from_the_middle(history):
    gone = history[10]
    tamper("DELETE FROM core_auditevent WHERE id=%s", [gone])
    message = verify_fails()
    assert f"first missing id #{gone}" in message and f"at event #{gone + 1} " in message


@pytest.mark.parametrize("unkeyed", [False, True], ids=["keeping-the-key-id", "posing-as-unkeyed"])
def test_verify_audit_notices_an_edit_with_the_following_hashes_recomputed_in_sha256(history, unkeyed):
    """The database owner's rewrite: edit one event, then recompute its hash and every
    later one with the same unkeyed SHA-256 the old chain used, so that each link holds."""
    target = history[12]
    prev = AuditEvent.objects.get(pk=target - 1).hash
    for event in AuditEvent.objects.filter(id__gte=target).order_by("id"):
        if event.pk == target:
            event.reason = "nothing happened here"
        event.key_id = "" if unkeyed else event.key_id
        forged = event_hash(prev, hashed_fields(event))
        tamper("UPDATE core_auditevent SET reason=%s, prev_hash=%s, hash=%s, key_id=%s WHERE id=%s",
               [event.reason, prev, forged, event.key_id, event.pk])
        prev = forged
    assert audit_verify()[1].pk == target
    assert f"at event #{target} " in verify_fails()


def test_verify_audit_notices_a_log_rewritten_whole_against_its_anchor(history, settings):
    """Even someone holding the key who rewrites and re-signs every event is caught by
    the anchor taken before: its event no longer carries the anchored hash."""
    anchor()
    key = settings.AUDIT_KEYS[settings.AUDIT_KEY_ID].encode()
    prev = "0" * 64
    for event in AuditEvent.objects.order_by("id"):
        event.reason = "rewritten" if event.pk == history[3] else event.reason
        forged = event_mac(prev, hashed_fields(event), event_id=event.pk, key_id=event.key_id, key=key)
        tamper("UPDATE core_auditevent SET reason=%s, prev_hash=%s, hash=%s WHERE id=%s",
               [event.reason, prev, forged, event.pk])
        prev = forged
    assert audit_verify() == (len(history), None)
    message = verify_fails()
    assert message.startswith("audit log differs from its anchor") and f"#{history[-1]} " in message


def test_an_edited_anchor_file_is_reported_and_nothing_is_anchored_on_it(history, audit_anchor_path):
    anchor()
    line = json.loads(audit_anchor_path.read_text())
    line["count"] -= 20
    line["last_id"] -= 20
    audit_anchor_path.write_text(json.dumps(line) + "\n")
    assert "line 1 does not verify" in verify_fails()
    with pytest.raises(CommandError, match="not anchored: .*line 1 does not verify"):
        call_command("anchor_audit", stdout=StringIO())
    assert len(audit_anchor_path.read_text().splitlines()) == 1


def test_a_broken_chain_is_never_anchored(history, audit_anchor_path):
    anchor()
    audit_record(actor=None, action="test.after", object_type="test", object_id=1)
    tamper("UPDATE core_auditevent SET reason='x' WHERE id=%s", [history[-1] + 1])
    with pytest.raises(CommandError, match=f"not anchored: audit chain broken at event #{history[-1] + 1} "):
        call_command("anchor_audit", stdout=StringIO())
    assert len(audit_anchor_path.read_text().splitlines()) == 1


def test_an_event_deleted_before_the_anchor_is_never_anchored_over(history, audit_anchor_path):
    """anchor_audit verifies only what came after the newest anchor, but counts the
    whole log: a deletion behind the anchor is refused, not anchored over."""
    anchor()
    audit_record(actor=None, action="test.after", object_type="test", object_id=1)
    tamper("DELETE FROM core_auditevent WHERE id=%s", [history[2]])
    with pytest.raises(CommandError, match="not anchored: audit log holds"):
        call_command("anchor_audit", stdout=StringIO())
    tamper("DELETE FROM core_auditevent WHERE id=%s", [history[-1]])
    with pytest.raises(CommandError, match=f"not anchored: .*first missing id #{history[2]}"):
        call_command("anchor_audit", stdout=StringIO())
    assert len(audit_anchor_path.read_text().splitlines()) == 1


def test_a_rotated_key_still_verifies_the_events_it_signed(activity, settings):
    old_id, old_secret = settings.AUDIT_KEY_ID, settings.AUDIT_KEYS[settings.AUDIT_KEY_ID]
    anchor()
    settings.AUDIT_KEY_ID = "k2"
    settings.AUDIT_KEYS = {"k2": "the-second-key-is-also-at-least-32-chars", old_id: old_secret}
    audit_record(actor=None, action="test.after_rotation", object_type="test", object_id=1)
    assert AuditEvent.objects.order_by("-id").first().key_id == "k2"
    anchor()
    out = StringIO()
    call_command("verify_audit", stdout=out)
    assert f"{AuditEvent.objects.count()} event(s) verified" in out.getvalue()

    settings.AUDIT_KEYS = {"k2": settings.AUDIT_KEYS["k2"]}  # the old key dropped too soon
    message = verify_fails()
    assert f"signed with audit key {old_id!r}, which is not configured" in message


def test_events_from_before_the_key_still_verify_as_the_first_of_the_chain(db):
    """The migration path: events written by the unkeyed chain (key_id '', plain SHA-256,
    ids with the holes a sequence leaves) verify as they are; the first keyed event
    signs their head, and an unkeyed event after it is a break."""
    prev = "0" * 64
    for event_id in (3, 4, 9):
        event = AuditEvent(id=event_id, at=timezone.now(), actor_name="system", action="legacy.event",
                           object_type="t", object_id=str(event_id), data={}, prev_hash=prev)
        event.hash = event_hash(prev, hashed_fields(event))
        tamper("INSERT INTO core_auditevent (id, at, actor_name, action, object_type, object_id, dataset, "
               "from_state, to_state, reason, data, prev_hash, hash, key_id) "
               "VALUES (%s, %s, 'system', 'legacy.event', 't', %s, '', '', '', '', '{}', %s, %s, '')",
               [event_id, event.at, str(event_id), prev, event.hash])
        prev = event.hash
    keyed = audit_record(actor=None, action="t.keyed", object_type="t", object_id=1)
    assert (keyed.pk, keyed.prev_hash) == (10, prev)
    out = StringIO()
    call_command("verify_audit", stdout=out)
    assert "4 event(s) verified, 3 of them unkeyed from before AUDIT_KEY" in out.getvalue()

    # Rewriting a legacy event (re-hashing the legacy tail) breaks the keyed event after it.
    legacy = AuditEvent.objects.get(pk=4)
    legacy.reason = "forged"
    tamper("UPDATE core_auditevent SET reason='forged', hash=%s WHERE id=4", [event_hash(legacy.prev_hash,
                                                                                         hashed_fields(legacy))])
    assert audit_verify()[1].pk == 9


def test_an_unkeyed_event_after_keyed_ones_is_a_break(activity):
    last = AuditEvent.objects.order_by("-id").first()
    tamper("UPDATE core_auditevent SET key_id='', hash=%s WHERE id=%s",
           [event_hash(last.prev_hash, hashed_fields(last)), last.pk])
    assert "an unkeyed event after keyed ones" in verify_fails()


def test_docs_show_the_app_role_sql_the_command_prints():
    from pathlib import Path

    from backfill_portal.core.dbroles import app_role_sql

    docs = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text()
    statements = app_role_sql(role="portal_app", owner="portal_owner", database="portal")
    assert "\n".join(s + ";" for s in statements) in docs
