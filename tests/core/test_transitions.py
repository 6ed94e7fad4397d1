"""apply_transition's conditional update: the columns land as the model would store
them, and a row that moved on meanwhile is a conflict that changes nothing."""
from __future__ import annotations

from datetime import datetime, timezone

import pytest

from backfill_portal.backfills.choices import RequestStatus
from backfill_portal.backfills.models import BackfillRequest
from backfill_portal.backfills.services.requests import backfill_request_create
from backfill_portal.backfills.transitions import request_transition
from backfill_portal.core.errors import ConflictError
from backfill_portal.core.models import AuditEvent

pytestmark = pytest.mark.django_db

AT = datetime(2024, 3, 5, 7, 8, 9, 123456, tzinfo=timezone.utc)


def test_a_transition_stores_foreign_keys_json_and_times_and_audits_once(alice, catalog):
    request, _ = backfill_request_create(actor=alice, job="dwd_order_items", start="2022-10-01", end="2022-10-02",
                                         reason="late events")
    loaded = BackfillRequest.objects.select_related("job__dataset", "job__current_code_version").get(pk=request.pk)
    version = loaded.job.current_code_version
    request_transition(loaded, to=RequestStatus.PENDING_APPROVAL, actor=alice,
                       updates={"code_version": version, "submitted_at": AT, "overlaps": [3, 5]})
    stored = BackfillRequest.objects.get(pk=request.pk)
    assert (stored.status, stored.code_version_id, stored.submitted_at, stored.overlaps) == (
        RequestStatus.PENDING_APPROVAL, version.pk, AT, [3, 5])
    assert loaded.status == RequestStatus.PENDING_APPROVAL and loaded.overlaps == [3, 5]
    assert AuditEvent.objects.filter(request_id=request.pk, to_state=RequestStatus.PENDING_APPROVAL).count() == 1


def test_a_row_that_moved_on_is_a_conflict_and_nothing_changes(alice, catalog):
    request, _ = backfill_request_create(actor=alice, job="dwd_order_items", start="2022-10-01", end="2022-10-02",
                                         reason="late events")
    stale = BackfillRequest.objects.select_related("job__dataset").get(pk=request.pk)
    fresh = BackfillRequest.objects.select_related("job__dataset").get(pk=request.pk)
    request_transition(fresh, to=RequestStatus.CANCELLED, actor=alice)
    events = AuditEvent.objects.count()
    with pytest.raises(ConflictError):
        request_transition(stale, to=RequestStatus.PENDING_APPROVAL, actor=alice, updates={"submitted_at": AT})
    stored = BackfillRequest.objects.get(pk=request.pk)
    assert stored.status == RequestStatus.CANCELLED and stored.submitted_at is None
    assert AuditEvent.objects.count() == events


def _drafts(alice, n):
    return [BackfillRequest.objects.select_related("job__dataset").get(pk=backfill_request_create(
        actor=alice, job="dwd_order_items", start="2022-10-01", end="2022-10-02", reason="late events")[0].pk)
        for _ in range(n)]


@pytest.mark.parametrize("overlaps", [[[3], [5], [7]], [[3], [3], [3]]], ids=["each its own", "all the same"])
def test_several_rows_in_one_update_each_store_their_own_value_and_audit_once(alice, catalog, overlaps):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from backfill_portal.backfills.transitions import REQUEST_EDGES
    from backfill_portal.core.transitions import apply_transitions

    requests = _drafts(alice, 3)
    given = {request.pk: value for request, value in zip(requests, overlaps)}
    with CaptureQueriesContext(connection) as statements:
        apply_transitions(instances=requests, to=RequestStatus.PENDING_APPROVAL, edges=REQUEST_EDGES, actor=alice,
                          object_type="request", audit=lambda request: {"request_id": request.pk},
                          updates={"submitted_at": AT, "overlaps": lambda request: given[request.pk]})
    (update,) = [q["sql"] for q in statements.captured_queries if q["sql"].startswith('UPDATE "backfills_backfillrequest"')]
    # One value for all when they agree; one CASE on the primary key when they differ.
    assert ("CASE" in update) == (len({str(v) for v in overlaps}) > 1)
    for request in BackfillRequest.objects.filter(pk__in=given):
        assert (request.status, request.submitted_at, request.overlaps) == (
            RequestStatus.PENDING_APPROVAL, AT, given[request.pk])
    assert [r.overlaps for r in requests] == overlaps  # and in memory
    assert AuditEvent.objects.filter(request_id__in=given, to_state=RequestStatus.PENDING_APPROVAL).count() == 3


@pytest.mark.parametrize("same", [True, False], ids=["one expectation for all", "each its own"])
def test_several_rows_move_only_if_each_still_holds_what_it_is_expected_to(alice, catalog, same):
    from backfill_portal.backfills.transitions import REQUEST_EDGES
    from backfill_portal.core.transitions import apply_transitions

    requests = _drafts(alice, 2)
    expected = {request.pk: {"reason": "late events" if same or i == 0 else "another reason"}
                for i, request in enumerate(requests)}

    def move():
        apply_transitions(instances=requests, to=RequestStatus.CANCELLED, edges=REQUEST_EDGES, actor=alice,
                          object_type="request", audit=lambda request: {"request_id": request.pk},
                          expect=lambda request: expected[request.pk])

    if same:
        move()
        assert set(BackfillRequest.objects.filter(pk__in=expected).values_list("status", flat=True)) == {
            RequestStatus.CANCELLED}
    else:
        # The second row no longer holds what it is expected to: all or nothing.
        from django.db import transaction

        with pytest.raises(ConflictError), transaction.atomic():
            move()
        assert set(BackfillRequest.objects.filter(pk__in=expected).values_list("status", flat=True)) == {
            RequestStatus.DRAFT}
        assert not AuditEvent.objects.filter(request_id__in=expected, to_state=RequestStatus.CANCELLED).exists()
