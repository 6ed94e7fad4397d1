"""The backfill request lifecycle through the API and the transition functions.

Every transition test checks its audit row; every refusal checks that nothing moved.
"""
from __future__ import annotations

import itertools
from datetime import UTC, datetime

import pytest

from backfill_portal.backfills.choices import RequestStatus, StepKind, StepStatus
from backfill_portal.backfills.models import ApprovalStep, BackfillRequest, Interval
from backfill_portal.backfills.transitions import REQUEST_EDGES, REQUEST_TERMINAL, request_transition
from backfill_portal.catalog.models import CodeVersion, Job
from backfill_portal.catalog.services.sync import catalog_sync
from backfill_portal.core.errors import ConflictError
from backfill_portal.core.models import AuditEvent
from tests.conftest import TEST_CATALOG

OLD_SQL_TAIL = ") AS latest WHERE rn = 1"
NEW_SQL_TAIL = ") AS latest WHERE rn = 1 AND amount IS NOT NULL"


# --- helpers -----------------------------------------------------------------------------


def create(client, **overrides):
    body = {"job": "dwd_order_items", "start": "2022-10-01", "end": "2022-10-03",
            "reason": "late order events from the payment gateway"}
    body.update(overrides)
    return client.post("/api/requests/", body, format="json")


def created(client, **overrides) -> dict:
    response = create(client, **overrides)
    assert response.status_code == 201, response.json()
    return response.json()


def post(client, request_id: int, verb: str, **body):
    return client.post(f"/api/requests/{request_id}/{verb}/", body, format="json")


def state_rows(request_id: int):
    """Audit rows recording a state change of the request itself."""
    return AuditEvent.objects.filter(object_type="request", request_id=request_id,
                                     action__startswith="request.").exclude(from_state="")


def status_of(request_id: int) -> str:
    return BackfillRequest.objects.values_list("status", flat=True).get(pk=request_id)


def assert_one_state_row(request_id: int, before_ids: set[int], *, actor: str, frm: str, to: str) -> AuditEvent:
    new = [row for row in state_rows(request_id) if row.pk not in before_ids]
    assert len(new) == 1, [(r.action, r.from_state, r.to_state) for r in new]
    row = new[0]
    assert (row.actor_name, row.from_state, row.to_state, row.request_id) == (actor, frm, to, request_id)
    assert row.object_id == str(request_id)
    assert row.actor is not None and row.actor.username == actor
    return row


def row_ids(request_id: int) -> set[int]:
    return set(state_rows(request_id).values_list("pk", flat=True))


def assert_conflict(response, field: str = "status") -> None:
    assert response.status_code == 409, response.json()
    assert field in response.json()["errors"], response.json()


def make_pending(api, requester="alice", **overrides) -> int:
    request_id = created(api(requester), **overrides)["id"]
    response = post(api(requester), request_id, "submit")
    assert response.status_code == 200, response.json()
    return request_id


# --- creating a draft plans its intervals --------------------------------------------------


def test_create_draft_plans_31_shanghai_days(api, catalog):
    response = create(api("alice"), start="2022-10-01", end="2022-10-31")
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["status"] == RequestStatus.DRAFT
    assert body["interval_count"] == 31 and len(body["intervals"]) == 31
    assert body["intervals"][0]["partition_key"] == "2022-10-01"
    assert body["intervals"][-1]["partition_key"] == "2022-10-31"
    assert datetime.fromisoformat(body["intervals"][0]["start"].replace("Z", "+00:00")) == datetime(2022, 9, 30, 16, tzinfo=UTC)
    assert datetime.fromisoformat(body["range_end"].replace("Z", "+00:00")) == datetime(2022, 10, 31, 16, tzinfo=UTC)
    assert body["code_version"] is None  # frozen at submission, not before
    assert Interval.objects.filter(request_id=body["id"]).count() == 31
    [row] = AuditEvent.objects.filter(request_id=body["id"], action="request.create")
    assert (row.actor_name, row.to_state) == ("alice", RequestStatus.DRAFT)


def test_create_hourly_dst_fall_back_day_has_25_intervals(api, catalog):
    body = created(api("alice"), job="page_views_hourly",
                   start="2022-11-06T00:00-04:00", end="2022-11-06T23:00-05:00")
    assert body["interval_count"] == 25
    keys = [iv["partition_key"] for iv in body["intervals"]]
    assert len(keys) == 25 == len(set(keys))
    # The repeated 01:00 hour appears twice, distinguished by its offset.
    assert "2022-11-06T01:00-04:00" in keys and "2022-11-06T01:00-05:00" in keys


def test_create_monthly_london_year_has_12_intervals(api, catalog):
    body = created(api("alice"), job="monthly_summary", start="2022-01", end="2022-12")
    assert body["interval_count"] == 12
    assert [iv["partition_key"] for iv in body["intervals"]] == [f"2022-{m:02d}" for m in range(1, 13)]


# --- submit freezes the code version ---------------------------------------------------------


def _resync_with_changed_sql():
    assert TEST_CATALOG.count(OLD_SQL_TAIL) == 1
    report = catalog_sync(text=TEST_CATALOG.replace(OLD_SQL_TAIL, NEW_SQL_TAIL))
    assert "job dwd_order_items" in report.changed


def test_submit_freezes_code_version_against_later_catalog_change(api, catalog):
    job = Job.objects.get(name="dwd_order_items")
    old = job.current_code_version
    submitted = make_pending(api)
    late_draft = created(api("alice"), start="2022-11-01", end="2022-11-02")["id"]

    _resync_with_changed_sql()

    job.refresh_from_db()
    assert job.current_code_version_id != old.pk
    assert CodeVersion.objects.filter(pk=old.pk).exists()  # the old version is kept
    assert set(job.code_versions.values_list("hash", flat=True)) == {old.hash, job.current_code_version.hash}

    request = BackfillRequest.objects.get(pk=submitted)
    assert request.code_version.hash == old.hash
    hashes = set(Interval.objects.filter(request=request).values_list("code_version__hash", flat=True))
    assert hashes == {old.hash}
    assert api("alice").get(f"/api/requests/{submitted}/").json()["code_version"] == old.hash

    # Created before the change, submitted after it: it gets the new code.
    response = post(api("alice"), late_draft, "submit")
    assert response.status_code == 200, response.json()
    assert response.json()["code_version"] == job.current_code_version.hash
    hashes = set(Interval.objects.filter(request_id=late_draft).values_list("code_version__hash", flat=True))
    assert hashes == {job.current_code_version.hash}


# --- legal transitions, each with exactly one audit row ------------------------------------


def test_submit_moves_draft_to_pending_approval_with_audit_row(api, catalog):
    request_id = created(api("alice"))["id"]
    before = row_ids(request_id)
    response = post(api("alice"), request_id, "submit")
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["status"] == RequestStatus.PENDING_APPROVAL
    assert body["submitted_at"] is not None
    [step] = body["approval_steps"]
    assert (step["kind"], step["approver"], step["status"]) == (StepKind.OWNER, "olivia", StepStatus.PENDING)
    row = assert_one_state_row(request_id, before, actor="alice", frm="draft", to="pending_approval")
    assert row.action == "request.submit"


def test_owner_approval_moves_pending_to_approved_with_audit_row(api, catalog):
    request_id = make_pending(api)
    before = row_ids(request_id)
    response = post(api("olivia"), request_id, "approve", comment="go ahead")
    assert response.status_code == 200, response.json()
    assert response.json()["status"] == RequestStatus.APPROVED
    row = assert_one_state_row(request_id, before, actor="olivia", frm="pending_approval", to="approved")
    assert row.action == "request.approve"
    step = ApprovalStep.objects.get(request_id=request_id)
    assert (step.status, step.decided_by.username) == (StepStatus.APPROVED, "olivia")
    assert AuditEvent.objects.filter(object_type="approval_step", object_id=str(step.pk),
                                     from_state="pending", to_state="approved", actor_name="olivia").count() == 1


def test_request_with_side_effect_is_approved_only_after_every_step(api, catalog):
    # The side-effect node is authorised where the plan runs it: in the cascade.
    request_id = make_pending(api, side_effects=["notify_finance"], cascade="cascade")
    steps = {s.kind: s for s in ApprovalStep.objects.filter(request_id=request_id)}
    assert steps[StepKind.SIDE_EFFECT].approver.username == "finn"
    for step in ApprovalStep.objects.filter(request_id=request_id).exclude(kind=StepKind.SIDE_EFFECT):
        assert post(api(step.approver.username), request_id, "approve").status_code == 200
    assert status_of(request_id) == RequestStatus.PENDING_APPROVAL
    before = row_ids(request_id)
    assert post(api("finn"), request_id, "approve").status_code == 200
    assert status_of(request_id) == RequestStatus.APPROVED
    assert_one_state_row(request_id, before, actor="finn", frm="pending_approval", to="approved")


def test_owner_rejection_with_comment_moves_pending_to_rejected(api, catalog):
    request_id = make_pending(api)
    before = row_ids(request_id)
    response = post(api("olivia"), request_id, "reject", comment="wrong range: the outage was in November")
    assert response.status_code == 200, response.json()
    assert response.json()["status"] == RequestStatus.REJECTED
    row = assert_one_state_row(request_id, before, actor="olivia", frm="pending_approval", to="rejected")
    assert row.action == "request.reject"
    assert row.reason == "wrong range: the outage was in November"


@pytest.mark.parametrize("state", ["draft", "pending_approval", "approved"])
def test_requester_can_cancel_draft_pending_or_approved_request(api, catalog, state):
    request_id = created(api("alice"))["id"]
    if state != "draft":
        assert post(api("alice"), request_id, "submit").status_code == 200
    if state == "approved":
        assert post(api("olivia"), request_id, "approve").status_code == 200
    assert status_of(request_id) == state
    before = row_ids(request_id)
    response = post(api("alice"), request_id, "cancel", reason="not needed after all")
    assert response.status_code == 200, response.json()
    assert response.json()["status"] == RequestStatus.CANCELLED
    assert response.json()["finished_at"] is not None
    row = assert_one_state_row(request_id, before, actor="alice", frm=state, to="cancelled")
    assert row.action == "request.cancel"
    assert not ApprovalStep.objects.filter(request_id=request_id, status=StepStatus.PENDING).exists()
    assert set(Interval.objects.filter(request_id=request_id).values_list("status", flat=True)) == {"cancelled"}


@pytest.mark.parametrize("body", [{}, {"reason": ""}, {"reason": "   "}])
def test_cancel_needs_a_reason(api, catalog, body):
    request_id = make_pending(api)
    before = row_ids(request_id)
    response = api("alice").post(f"/api/requests/{request_id}/cancel/", body, format="json")
    assert response.status_code == 400, response.json()
    assert response.json()["errors"] == {"reason": ["say why you cancel; the requester and auditors will read it"]}
    assert status_of(request_id) == RequestStatus.PENDING_APPROVAL
    assert row_ids(request_id) == before
    assert ApprovalStep.objects.get(request_id=request_id).status == StepStatus.PENDING


def test_oncall_can_cancel_someone_elses_request(api, catalog):
    request_id = make_pending(api)
    before = row_ids(request_id)
    assert post(api("oscar"), request_id, "cancel", reason="incident").status_code == 200
    assert_one_state_row(request_id, before, actor="oscar", frm="pending_approval", to="cancelled")


def test_another_requester_cannot_cancel_request(api, catalog):
    request_id = make_pending(api)
    before = row_ids(request_id)
    response = post(api("sam"), request_id, "cancel")
    assert response.status_code == 403
    assert status_of(request_id) == RequestStatus.PENDING_APPROVAL
    assert row_ids(request_id) == before
    assert AuditEvent.objects.filter(request_id=request_id, action="denied.request.cancel", actor_name="sam").count() == 1


# --- illegal transitions: 409, nothing moves, nothing audited ------------------------------


def _assert_refused(api, who: str, request_id: int, verb: str, **body) -> None:
    state = status_of(request_id)
    before = row_ids(request_id)
    events = AuditEvent.objects.count()
    response = post(api(who), request_id, verb, **body)
    assert_conflict(response, "status")
    assert status_of(request_id) == state
    assert row_ids(request_id) == before
    assert AuditEvent.objects.count() == events


def test_cancelling_a_cancelled_request_is_a_conflict(api, catalog):
    request_id = created(api("alice"))["id"]
    assert post(api("alice"), request_id, "cancel", reason="not needed").status_code == 200
    _assert_refused(api, "alice", request_id, "cancel", reason="not needed")
    # Said as a person would: not "is cancelled; it cannot become cancelled".
    again = post(api("alice"), request_id, "cancel", reason="not needed")
    assert again.json()["detail"] == f"request {request_id} is already cancelled"


def test_cancelling_a_rejected_request_is_a_conflict(api, catalog):
    request_id = make_pending(api)
    assert post(api("olivia"), request_id, "reject", comment="no").status_code == 200
    _assert_refused(api, "alice", request_id, "cancel", reason="not needed")


def test_submitting_twice_is_a_conflict(api, catalog):
    request_id = make_pending(api)
    _assert_refused(api, "alice", request_id, "submit")
    assert ApprovalStep.objects.filter(request_id=request_id).count() == 1


def test_approving_a_draft_is_a_conflict(api, catalog):
    request_id = created(api("alice"))["id"]
    _assert_refused(api, "olivia", request_id, "approve")


def test_approving_an_approved_request_is_a_conflict(api, catalog):
    request_id = make_pending(api)
    assert post(api("olivia"), request_id, "approve").status_code == 200
    _assert_refused(api, "olivia", request_id, "approve")


# --- the transitions map itself ----------------------------------------------------------------

ALL_PAIRS = list(itertools.product(RequestStatus.values, RequestStatus.values))


@pytest.mark.parametrize(("frm", "to"), ALL_PAIRS, ids=[f"{a}->{b}" for a, b in ALL_PAIRS])
def test_request_transition_allows_exactly_the_mapped_edges(alice, catalog, frm, to):
    from backfill_portal.backfills.services.requests import backfill_request_create

    request, _ = backfill_request_create(actor=alice, job="dwd_order_items", start="2022-10-01",
                                         end="2022-10-01", reason="edge test")
    # Test setup only: put the row in the starting state without a transition.
    BackfillRequest.objects.filter(pk=request.pk).update(status=frm)
    request = BackfillRequest.objects.select_related("job__dataset").get(pk=request.pk)
    before = AuditEvent.objects.count()
    legal = to in REQUEST_EDGES[frm]
    if legal:
        request_transition(request, to=to, actor=alice, reason="edge test")
        assert request.status == to
        assert status_of(request.pk) == to
        [row] = AuditEvent.objects.order_by("id")[before:]
        assert (row.action, row.from_state, row.to_state, row.request_id, row.actor_name) == (
            f"request.{to}", frm, to, request.pk, "alice")
        finished = BackfillRequest.objects.get(pk=request.pk).finished_at
        assert (finished is not None) == (to in REQUEST_TERMINAL)
    else:
        with pytest.raises(ConflictError) as exc:
            request_transition(request, to=to, actor=alice)
        assert "status" in exc.value.fields
        assert status_of(request.pk) == frm
        assert AuditEvent.objects.count() == before


def test_edges_map_names_every_status_and_terminal_states_are_dead_ends():
    assert set(REQUEST_EDGES) == set(RequestStatus.values)
    for frm, targets in REQUEST_EDGES.items():
        assert targets <= set(RequestStatus.values), frm
    for state in (RequestStatus.REJECTED, RequestStatus.CANCELLED, RequestStatus.ROLLED_BACK):
        assert REQUEST_EDGES[state] == frozenset()


def test_lost_race_between_stale_copies_claims_once(alice, oscar, catalog):
    from backfill_portal.backfills.services.requests import backfill_request_create

    request, _ = backfill_request_create(actor=alice, job="dwd_order_items", start="2022-10-01",
                                         end="2022-10-02", reason="race")
    first = BackfillRequest.objects.select_related("job__dataset").get(pk=request.pk)
    second = BackfillRequest.objects.select_related("job__dataset").get(pk=request.pk)
    before = AuditEvent.objects.count()
    request_transition(first, to=RequestStatus.PENDING_APPROVAL, actor=alice)
    assert second.status == RequestStatus.DRAFT  # stale: draft -> cancelled looks legal to it
    with pytest.raises(ConflictError) as exc:
        request_transition(second, to=RequestStatus.CANCELLED, actor=oscar)
    assert "status" in exc.value.fields
    assert status_of(request.pk) == RequestStatus.PENDING_APPROVAL
    assert AuditEvent.objects.count() == before + 1
    assert not AuditEvent.objects.filter(request_id=request.pk, to_state=RequestStatus.CANCELLED).exists()


def test_lost_race_on_the_same_edge_claims_once(alice, catalog):
    from backfill_portal.backfills.services.requests import backfill_request_create

    request, _ = backfill_request_create(actor=alice, job="dwd_order_items", start="2022-10-01",
                                         end="2022-10-02", reason="race")
    first = BackfillRequest.objects.select_related("job__dataset").get(pk=request.pk)
    second = BackfillRequest.objects.select_related("job__dataset").get(pk=request.pk)
    request_transition(first, to=RequestStatus.CANCELLED, actor=alice)
    with pytest.raises(ConflictError):
        request_transition(second, to=RequestStatus.CANCELLED, actor=alice)
    assert AuditEvent.objects.filter(request_id=request.pk, to_state=RequestStatus.CANCELLED).count() == 1



def test_a_lost_race_inside_a_callers_transaction_leaves_it_usable(alice, oscar, catalog):
    """Transitions take no savepoint; a lost race changes nothing, so the caller's
    transaction goes on and commits what it did besides."""
    from django.db import transaction

    from backfill_portal.backfills.services.requests import backfill_request_create

    request, _ = backfill_request_create(actor=alice, job="dwd_order_items", start="2022-10-01",
                                         end="2022-10-02", reason="race")
    other, _ = backfill_request_create(actor=alice, job="dwd_order_items", start="2022-11-01",
                                       end="2022-11-02", reason="other")
    stale = BackfillRequest.objects.select_related("job__dataset").get(pk=request.pk)
    request_transition(BackfillRequest.objects.get(pk=request.pk), to=RequestStatus.CANCELLED, actor=alice)
    with transaction.atomic():
        with pytest.raises(ConflictError):
            request_transition(stale, to=RequestStatus.PENDING_APPROVAL, actor=alice)
        request_transition(BackfillRequest.objects.select_related("job__dataset").get(pk=other.pk),
                           to=RequestStatus.CANCELLED, actor=oscar)
    assert status_of(request.pk) == RequestStatus.CANCELLED and status_of(other.pk) == RequestStatus.CANCELLED
    assert AuditEvent.objects.filter(request_id=other.pk, to_state=RequestStatus.CANCELLED).count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_failed_audit_write_undoes_the_state_change(alice, catalog):
    """Invariant 8: the change and its audit row commit together or not at all (a real
    transaction here: inside a test's own, the failure dooms that one instead)."""
    from django.db import connection

    from backfill_portal.backfills.services.requests import backfill_request_create

    request, _ = backfill_request_create(actor=alice, job="dwd_order_items", start="2022-10-01",
                                         end="2022-10-02", reason="audit fails")
    before = AuditEvent.objects.count()
    audit_table = connection.ops.quote_name(AuditEvent._meta.db_table)

    def audit_store_refuses(execute, sql, params, many, context):
        """The database refuses the audit row's INSERT (and only that)."""
        if sql.lstrip().upper().startswith("INSERT") and audit_table in sql:
            raise RuntimeError("audit store unavailable")
        return execute(sql, params, many, context)

    with pytest.raises(RuntimeError, match="audit store unavailable"), connection.execute_wrapper(audit_store_refuses):
        request_transition(BackfillRequest.objects.select_related("job__dataset").get(pk=request.pk),
                           to=RequestStatus.CANCELLED, actor=alice)
    assert status_of(request.pk) == RequestStatus.DRAFT
    assert AuditEvent.objects.count() == before

# --- idempotency keys ---------------------------------------------------------------------------


def test_same_idempotency_key_and_payload_returns_the_same_request(api, catalog):
    first = create(api("alice"), idempotency_key="ticket-4711")
    assert first.status_code == 201, first.json()
    events = AuditEvent.objects.count()
    second = create(api("alice"), idempotency_key="ticket-4711")
    assert second.status_code == 200, second.json()
    assert second.json()["id"] == first.json()["id"]
    assert BackfillRequest.objects.count() == 1
    assert Interval.objects.count() == 3
    assert AuditEvent.objects.count() == events


def test_same_idempotency_key_with_different_payload_is_a_conflict(api, catalog):
    assert create(api("alice"), idempotency_key="ticket-4711").status_code == 201
    events = AuditEvent.objects.count()
    response = create(api("alice"), idempotency_key="ticket-4711", end="2022-10-05")
    assert_conflict(response, "idempotency_key")
    assert BackfillRequest.objects.count() == 1
    assert AuditEvent.objects.count() == events


def test_different_users_may_use_the_same_idempotency_key(api, catalog):
    a = create(api("alice"), idempotency_key="ticket-4711")
    s = create(api("sam"), idempotency_key="ticket-4711")
    assert (a.status_code, s.status_code) == (201, 201)
    assert a.json()["id"] != s.json()["id"]
    assert s.json()["requested_by"] == "sam"
    assert BackfillRequest.objects.count() == 2


# --- overlapping requests -------------------------------------------------------------------


def test_overlapping_request_needs_confirmation_and_records_the_overlap(api, catalog):
    first = make_pending(api, start="2022-10-01", end="2022-10-10")
    second = created(api("sam"), start="2022-10-05", end="2022-10-15")["id"]
    before = row_ids(second)

    response = post(api("sam"), second, "submit")
    assert_conflict(response, "confirm_overlap")
    assert f"#{first}" in response.json()["detail"]
    assert status_of(second) == RequestStatus.DRAFT
    assert row_ids(second) == before
    assert not ApprovalStep.objects.filter(request_id=second).exists()

    response = post(api("sam"), second, "submit", confirm_overlap=True)
    assert response.status_code == 200, response.json()
    assert response.json()["status"] == RequestStatus.PENDING_APPROVAL
    assert response.json()["overlaps"] == [first]
    row = assert_one_state_row(second, before, actor="sam", frm="draft", to="pending_approval")
    assert row.data["overlaps"] == [first]


def test_adjacent_ranges_do_not_overlap(api, catalog):
    make_pending(api, start="2022-10-01", end="2022-10-10")
    second = created(api("alice"), start="2022-10-11", end="2022-10-20")["id"]
    response = post(api("alice"), second, "submit")
    assert response.status_code == 200, response.json()
    assert response.json()["overlaps"] == []


def test_overlap_with_a_cancelled_or_draft_request_is_not_flagged(api, catalog):
    cancelled = make_pending(api, start="2022-10-01", end="2022-10-10")
    assert post(api("alice"), cancelled, "cancel", reason="not needed").status_code == 200
    created(api("alice"), start="2022-10-01", end="2022-10-10")  # a draft is not active
    third = created(api("alice"), start="2022-10-05", end="2022-10-06")["id"]
    response = post(api("alice"), third, "submit")
    assert response.status_code == 200, response.json()
    assert response.json()["overlaps"] == []


def test_same_range_on_another_job_is_not_an_overlap(api, catalog):
    make_pending(api, start="2022-10-01", end="2022-10-10")
    other = created(api("alice"), job="dws_sales_daily", start="2022-10-01", end="2022-10-10")["id"]
    response = post(api("alice"), other, "submit")
    assert response.status_code == 200, response.json()
    assert response.json()["overlaps"] == []


# --- rejection -----------------------------------------------------------------------------------


@pytest.mark.parametrize("comment", ["", "   "])
def test_rejection_needs_a_comment(api, catalog, comment):
    request_id = make_pending(api)
    before = row_ids(request_id)
    response = post(api("olivia"), request_id, "reject", comment=comment)
    assert response.status_code == 400, response.json()
    assert "comment" in response.json()["errors"]
    assert status_of(request_id) == RequestStatus.PENDING_APPROVAL
    assert row_ids(request_id) == before
    assert ApprovalStep.objects.get(request_id=request_id).status == StepStatus.PENDING


def test_rejection_cancels_the_other_pending_steps(api, catalog):
    request_id = make_pending(api, side_effects=["notify_finance"], cascade="cascade")
    before = row_ids(request_id)
    response = post(api("olivia"), request_id, "reject", comment="the source is still broken")
    assert response.status_code == 200, response.json()
    steps = {s.kind: s for s in ApprovalStep.objects.filter(request_id=request_id)}
    assert steps[StepKind.OWNER].status == StepStatus.REJECTED
    assert steps[StepKind.SIDE_EFFECT].status == StepStatus.CANCELLED
    assert AuditEvent.objects.filter(object_type="approval_step", object_id=str(steps[StepKind.SIDE_EFFECT].pk),
                                     from_state="pending", to_state="cancelled").count() == 1
    assert_one_state_row(request_id, before, actor="olivia", frm="pending_approval", to="rejected")
    # Finn has nothing left to decide.
    assert post(api("finn"), request_id, "approve").status_code == 409


# --- separation of duties and roles -------------------------------------------------------


def _denied(request_id, actor: str) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(request_id=request_id, actor_name=actor, action__startswith="denied."))


def test_owner_request_on_own_dataset_goes_to_admins(api, catalog):
    request_id = make_pending(api, requester="olivia")
    [step] = ApprovalStep.objects.filter(request_id=request_id)
    assert step.kind == StepKind.OWNER and step.approver is None

    before = row_ids(request_id)
    response = post(api("olivia"), request_id, "approve")
    assert response.status_code == 403, response.json()
    assert status_of(request_id) == RequestStatus.PENDING_APPROVAL
    assert row_ids(request_id) == before
    assert [e.action for e in _denied(request_id, "olivia")] == ["denied.approval.approve"]

    response = post(api("admin"), request_id, "approve")
    assert response.status_code == 200, response.json()
    assert response.json()["status"] == RequestStatus.APPROVED
    assert_one_state_row(request_id, before, actor="admin", frm="pending_approval", to="approved")


def test_requester_cannot_approve_own_request(api, catalog):
    request_id = make_pending(api, requester="alice")
    # Even an admin who filed the request cannot approve it.
    admin_request = make_pending(api, requester="admin", start="2022-11-01", end="2022-11-02")
    for who, rid in (("alice", request_id), ("admin", admin_request)):
        before = row_ids(rid)
        response = post(api(who), rid, "approve")
        assert response.status_code == 403, response.json()
        assert status_of(rid) == RequestStatus.PENDING_APPROVAL
        assert row_ids(rid) == before
        assert len(_denied(rid, who)) == 1
    # Admin's own request: olivia (the owner) may approve it.
    assert post(api("olivia"), admin_request, "approve").status_code == 200


def test_another_datasets_owner_cannot_approve(api, catalog):
    request_id = make_pending(api)
    before = row_ids(request_id)
    response = post(api("sam"), request_id, "approve")
    assert response.status_code == 403, response.json()
    assert status_of(request_id) == RequestStatus.PENDING_APPROVAL
    assert row_ids(request_id) == before
    assert ApprovalStep.objects.get(request_id=request_id).status == StepStatus.PENDING
    assert [e.action for e in _denied(request_id, "sam")] == ["denied.approval.approve"]


def test_another_datasets_owner_cannot_reject(api, catalog):
    request_id = make_pending(api)
    response = post(api("sam"), request_id, "reject", comment="I dislike it")
    assert response.status_code == 403
    assert status_of(request_id) == RequestStatus.PENDING_APPROVAL
    assert [e.action for e in _denied(request_id, "sam")] == ["denied.approval.reject"]


@pytest.mark.parametrize("who", ["audrey", "outsider"])
def test_auditor_and_outsider_cannot_create_requests(api, catalog, who):
    events = AuditEvent.objects.count()
    response = create(api(who))
    assert response.status_code == 403, response.json()
    assert BackfillRequest.objects.count() == 0
    assert Interval.objects.count() == 0
    new = list(AuditEvent.objects.order_by("id")[events:])
    assert [(e.action, e.actor_name) for e in new] == [("denied.request.create", who)]


def test_only_the_requester_submits(api, catalog):
    request_id = created(api("alice"))["id"]
    response = post(api("sam"), request_id, "submit")
    assert response.status_code == 403
    assert status_of(request_id) == RequestStatus.DRAFT
    assert len(_denied(request_id, "sam")) == 1


def test_large_request_also_needs_an_admin_step(api, catalog, settings):
    settings.BACKFILL_ADMIN_APPROVAL_OVER = 2
    request_id = make_pending(api, requester="alice")  # three intervals
    steps = {s.kind: s for s in ApprovalStep.objects.filter(request_id=request_id)}
    assert set(steps) == {StepKind.OWNER, StepKind.ADMIN}
    assert steps[StepKind.ADMIN].approver is None
    assert post(api("olivia"), request_id, "approve").status_code == 200
    assert status_of(request_id) == RequestStatus.PENDING_APPROVAL
    # Another owner is not an admin.
    assert post(api("sam"), request_id, "approve").status_code == 403
    before = row_ids(request_id)
    assert post(api("admin"), request_id, "approve").status_code == 200
    assert_one_state_row(request_id, before, actor="admin", frm="pending_approval", to="approved")


def test_admin_cannot_approve_the_admin_step_of_own_request(api, catalog, settings):
    settings.BACKFILL_ADMIN_APPROVAL_OVER = 2
    request_id = make_pending(api, requester="admin")
    assert ApprovalStep.objects.filter(request_id=request_id, kind=StepKind.ADMIN, approver=None).exists()
    before = row_ids(request_id)
    response = post(api("admin"), request_id, "approve")
    assert response.status_code == 403, response.json()
    assert status_of(request_id) == RequestStatus.PENDING_APPROVAL
    assert row_ids(request_id) == before
    assert not ApprovalStep.objects.filter(request_id=request_id).exclude(status=StepStatus.PENDING).exists()
    assert len(_denied(request_id, "admin")) == 1


def test_step_decision_service_refuses_someone_elses_step(alice, sam, catalog):
    from backfill_portal.backfills.services.requests import (
        approval_step_decide,
        backfill_request_create,
        backfill_request_submit,
    )
    from backfill_portal.core.errors import PermissionDenied

    request, _ = backfill_request_create(actor=alice, job="dwd_order_items", start="2022-10-01",
                                         end="2022-10-02", reason="direct")
    backfill_request_submit(actor=alice, request_id=request.pk)
    step = ApprovalStep.objects.select_related("request", "dataset", "approver").get(request=request)
    for who in (sam, alice):
        with pytest.raises(PermissionDenied):
            approval_step_decide(actor=who, step=step, approve=True)
        assert len(_denied(request.pk, who.username)) == 1
    step.refresh_from_db()
    assert step.status == StepStatus.PENDING
    assert status_of(request.pk) == RequestStatus.PENDING_APPROVAL


def test_a_side_effect_node_the_plan_never_runs_cannot_be_authorised(api, catalog):
    """The exploratory test: authorising notify_finance on a request without a cascade
    was accepted and added an approval step its owner decided for nothing."""
    for cascade in ("none", "handoff"):
        response = api("alice").post("/api/requests/", {
            "job": "dwd_order_items", "start": "2022-10-01", "end": "2022-10-01", "reason": "r",
            "cascade": cascade, "side_effects": ["notify_finance"]}, format="json")
        assert response.status_code == 400, cascade
        assert response.json()["errors"]["side_effects"] == [
            f"notify_finance is not run by this request (cascade {cascade}): authorise a side-effect node only "
            "where the plan runs it"]


def test_an_approvers_second_click_is_a_conflict_not_a_refusal(api, catalog):
    """The exploratory test: of five parallel approvals by the rightful approver, one got
    403 'no approval step of this request is yours' and a `denied` audit row against
    them. Their step already decided, the request still waiting for others: a 409."""
    request_id = make_pending(api, cascade="cascade")
    assert ApprovalStep.objects.filter(request_id=request_id).count() > 1
    assert post(api("olivia"), request_id, "approve").status_code == 200
    assert status_of(request_id) == RequestStatus.PENDING_APPROVAL
    again = post(api("olivia"), request_id, "approve")
    assert again.status_code == 409 and "already decided (approved)" in again.json()["detail"]
    assert not AuditEvent.objects.filter(request_id=request_id, action__startswith="denied.").exists()
    # Someone with no step of it is still refused, and that is audited.
    assert post(api("audrey"), request_id, "approve").status_code == 403
    assert AuditEvent.objects.filter(request_id=request_id, action="denied.approval.approve",
                                     actor_name="audrey").exists()


def test_bad_input_under_a_used_idempotency_key_is_a_400_and_good_input_a_409(api, catalog):
    body = {"job": "dwd_order_items", "start": "2022-10-01", "end": "2022-10-02", "reason": "r",
            "idempotency_key": "qa-k1"}
    assert api("alice").post("/api/requests/", body, format="json").status_code == 201
    bad = api("alice").post("/api/requests/", {**body, "start": "bad"}, format="json")
    assert bad.status_code == 400 and "start" in bad.json()["errors"]
    other = api("alice").post("/api/requests/", {**body, "end": "2022-10-03"}, format="json")
    assert other.status_code == 409 and "idempotency key already used" in other.json()["detail"]
    assert api("alice").post("/api/requests/", body, format="json").status_code == 200  # the replay
