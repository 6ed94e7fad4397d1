"""The database owner's edits verify_audit must name plainly: a value its column cannot
read back, the first event deleted, and what no anchor covers yet."""
from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from backfill_portal.core.services.audit import audit_record, audit_verify
from tests.core.test_audit import activity, anchor, history, tamper, verify_fails  # noqa: F401 (fixtures)

sqlite_only = pytest.mark.skipif(connection.vendor != "sqlite",
                                 reason="PostgreSQL's typed columns refuse a value that is not a time or JSON")


@sqlite_only
@pytest.mark.parametrize("stored", ["garbage", "2026-13-45 10:00:00", 12345])
def test_verify_audit_names_an_event_whose_timestamp_is_not_a_time(history, stored):
    """Django read 'garbage' as None and crashed formatting it; '2026-13-45' raised in
    the middle of a fetch."""
    target = history[12]
    tamper("UPDATE core_auditevent SET at=%s WHERE id=%s", [stored, target])
    message = verify_fails()
    assert message.startswith(f"audit chain broken at event #{target} (")
    assert f"at {str(stored)!r}): its timestamp was altered" in message
    assert message.endswith(f"; {history.index(target)} event(s) before it verify")
    checked, broken = audit_verify()
    assert (checked, broken.pk) == (history.index(target), target)
    with pytest.raises(CommandError, match=f"not anchored: audit chain broken at event #{target} "):
        call_command("anchor_audit", stdout=StringIO())


@sqlite_only
def test_verify_audit_names_an_event_whose_data_is_not_json(history):
    target = history[12]
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA ignore_check_constraints = ON")  # the JSON_VALID check
        try:
            tamper("UPDATE core_auditevent SET data='{not json' WHERE id=%s", [target])
        finally:
            cursor.execute("PRAGMA ignore_check_constraints = OFF")
    message = verify_fails()
    assert message.startswith(f"audit chain broken at event #{target} (")
    assert message.endswith(f"; {history.index(target)} event(s) before it verify")


def test_verify_audit_names_the_first_event_deleted_by_its_id(history):
    """It said 'chain broken at event #2; 0 event(s) before it verify', as for an edit."""
    anchor()
    first = history[0]
    tamper("DELETE FROM core_auditevent WHERE id=%s", [first])
    message = verify_fails()
    assert message.startswith(f"audit chain broken at event #{first + 1} (")
    assert message.endswith(f": event(s) #{first} missing (first missing id #{first}); 0 event(s) before it verify")


def test_verify_audit_names_the_first_events_deleted_by_their_ids(history):
    anchor()
    tamper("DELETE FROM core_auditevent WHERE id<=%s", [history[2]])
    assert f"event(s) #{history[0]}..#{history[2]} missing (first missing id #{history[0]})" in verify_fails()


def test_verify_audit_without_an_anchor_says_events_before_the_first_are_missing(history):
    tamper("DELETE FROM core_auditevent WHERE id<=%s", [history[2]])
    message = verify_fails()
    assert message.startswith(f"audit chain broken at event #{history[3]} (")
    assert f"the event(s) before it are missing, up to #{history[2]} (" in message


def test_an_edited_first_event_is_still_an_edit_not_a_deletion(history):
    tamper("DELETE FROM core_auditevent WHERE id=%s", [history[0]])
    tamper("UPDATE core_auditevent SET reason='x' WHERE id=%s", [history[1]])
    message = verify_fails()
    assert message.startswith(f"audit chain broken at event #{history[1]} (")
    assert message.endswith("); 0 event(s) before it verify") and "missing" not in message


def verify_passes() -> str:
    out = StringIO()
    call_command("verify_audit", stdout=out)
    return out.getvalue().strip()


def test_verify_audit_counts_the_events_no_anchor_covers_yet(history):
    """Deleting the newest events written after the anchor cannot be proven from it; it
    said 'intact … matches its anchor' and nothing about them."""
    anchor()
    for n in range(5):
        audit_record(actor=None, action="test.after_anchor", object_type="test", object_id=n)
    message = verify_passes()
    assert message.startswith(f"audit log intact: {len(history) + 5} event(s) verified; matches its anchor of ")
    assert message.endswith(f"({len(history)} event(s) up to #{history[-1]}); 5 event(s) after #{history[-1]} are "
                            "not anchored yet: their deletion could not be detected until the next anchor "
                            "(manage.py anchor_audit)")

    tamper("DELETE FROM core_auditevent WHERE id>%s", [history[-1] + 2])
    assert "; 2 event(s) after #%d are not anchored yet" % history[-1] in verify_passes()

    anchor()
    assert "not anchored yet" not in verify_passes()


def test_verify_audit_counts_every_event_after_an_anchor_of_the_empty_log(db):
    anchor()
    audit_record(actor=None, action="test.after_anchor", object_type="test", object_id=1)
    assert verify_passes().endswith("; 1 event(s) are not anchored yet: their deletion could not be detected "
                                    "until the next anchor (manage.py anchor_audit)")
