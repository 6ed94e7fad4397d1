"""Lineage cascades and hand-offs, executed through the real pipeline."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from backfill_portal.backfills.choices import IntervalStatus, RequestStatus, StepKind
from backfill_portal.backfills.models import ApprovalStep, BackfillRequest, HandoffItem, Interval
from backfill_portal.backfills.services.handoff import handoff_accept, handoff_decline, handoffs_expire
from backfill_portal.backfills.services.requests import (
    approval_step_decide,
    backfill_request_create,
    backfill_request_decide,
    backfill_request_submit,
)
from backfill_portal.core.errors import ConflictError, NotFound, PermissionDenied, ValidationError
from backfill_portal.core.models import AuditEvent
from backfill_portal.execution.choices import RunStatus
from backfill_portal.execution.models import Delivery, Run
from backfill_portal.warehouse.models import Consumption

pytestmark = pytest.mark.django_db(transaction=True)
WEEK = dict(start="2022-10-01", end="2022-10-07")


@pytest.fixture
def ready(catalog, demo_sources, task_queue, warehouse):
    return task_queue


def file_cascade(personas, **kwargs):
    request, _ = backfill_request_create(actor=personas["alice"], job="dwd_order_items", reason="fix dedupe",
                                         cascade="cascade", **{**WEEK, **kwargs})
    backfill_request_submit(actor=personas["alice"], request_id=request.pk, confirm_overlap=True)
    return request


def test_cascade_plans_downstream_nodes_and_one_approval_step_per_owner(personas, ready):
    request = file_cascade(personas)
    assert request.node_actions == {"dws_sales_daily": "rebuild", "monthly_summary": "rebuild",
                                    "notify_finance": "skip"}
    per_job = {}
    for job, key in Interval.objects.filter(request=request).values_list("job__name", "partition_key"):
        per_job.setdefault(job, []).append(key)
    assert len(per_job["dwd_order_items"]) == len(per_job["dws_sales_daily"]) == len(per_job["notify_finance"]) == 7
    # Shanghai's 2022-10-01 starts at 17:00 on 30 September in London: both London months are touched.
    assert per_job["monthly_summary"] == ["2022-09", "2022-10"]
    steps = {(s.kind, s.dataset.name, s.approver.username) for s in ApprovalStep.objects.filter(request=request)}
    assert steps == {(StepKind.OWNER, "dwd_order_items", "olivia"), (StepKind.DOWNSTREAM, "dws_sales_daily", "sam"),
                     (StepKind.DOWNSTREAM, "monthly_summary", "rita")}


def test_cascade_runs_downstream_only_after_every_owner_approves_in_layer_order(personas, ready, warehouse):
    request = file_cascade(personas)
    backfill_request_decide(actor=personas["olivia"], request_id=request.pk, approve=True)
    ready.drain()
    assert not Run.objects.filter(request=request).exists()  # sam and rita have not approved yet
    rita_step = ApprovalStep.objects.get(request=request, approver=personas["rita"])
    with pytest.raises(PermissionDenied):  # an owner of X cannot approve for Y
        approval_step_decide(actor=personas["sam"], step=rita_step, approve=True)
    backfill_request_decide(actor=personas["sam"], request_id=request.pk, approve=True)
    with pytest.raises(ConflictError):  # approving twice
        approval_step_decide(actor=personas["sam"], step=ApprovalStep.objects.get(request=request,
                                                                                  approver=personas["sam"]),
                             approve=True)
    request.refresh_from_db()
    assert request.status == RequestStatus.PENDING_APPROVAL
    backfill_request_decide(actor=personas["rita"], request_id=request.pk, approve=True)
    request.refresh_from_db()
    assert request.status == RequestStatus.RUNNING
    ready.drain()
    request.refresh_from_db()
    assert request.status == RequestStatus.RECONCILING
    runs = {(r.job.name, r.partition_key): r for r in Run.objects.filter(request=request).select_related("job")}
    month = runs[("monthly_summary", "2022-10")]
    assert runs[("monthly_summary", "2022-09")].status == RunStatus.PUBLISHED
    for day in range(1, 8):
        key = f"2022-10-0{day}"
        dwd, dws = runs[("dwd_order_items", key)], runs[("dws_sales_daily", key)]
        assert dwd.status == dws.status == RunStatus.PUBLISHED
        assert dws.pk > dwd.pk and dws.created_at >= dwd.finished_at  # started after its upstream published
        pin = Consumption.objects.get(run=dws, dataset__name="dwd_order_items")
        assert pin.version.run_id == dwd.pk  # pinned the version this request published
        assert month.pk > dws.pk
        assert Consumption.objects.get(run=month, dataset__name="dws_sales_daily", partition_key=key).version.run_id == dws.pk
    skipped = Interval.objects.filter(request=request, job__name="notify_finance")
    assert set(skipped.values_list("status", flat=True)) == {IntervalStatus.SKIPPED}
    assert AuditEvent.objects.filter(request_id=request.pk, action="interval.skipped",
                                     reason="side-effect node not authorised by this request").count() == 7
    assert Delivery.objects.count() == 0


def test_authorised_side_effect_in_a_cascade_delivers_exactly_once_per_partition(personas, ready):
    request = file_cascade(personas, side_effects=["notify_finance"])
    assert request.node_actions["notify_finance"] == "rebuild"
    for name in ("olivia", "sam", "rita", "finn"):
        backfill_request_decide(actor=personas[name], request_id=request.pk, approve=True)
    ready.drain()
    request.refresh_from_db()
    assert request.status == RequestStatus.RECONCILING
    deliveries = Delivery.objects.filter(job__name="notify_finance")
    assert sorted(deliveries.values_list("partition_key", flat=True)) == [f"2022-10-0{d}" for d in range(1, 8)]
    # A re-run of the side-effect runs (a retried task) cannot deliver twice.
    from backfill_portal.execution.executors import PinnedInputs, deliver_side_effect
    run = Run.objects.filter(request=request, job__name="notify_finance").first()
    pins = PinnedInputs(versions={c.dataset.name: {c.partition_key: c.version.run.run_id}
                                  for c in Consumption.objects.filter(run=run).select_related("dataset", "version__run")})
    deliver_side_effect(run, __import__("backfill_portal.backends", fromlist=["x"]).get_warehouse(), pins,
                        run.code_version.definition)
    assert deliveries.count() == 7


def test_cascade_bad_input_is_refused_with_the_field_named(personas, catalog):
    with pytest.raises(ValidationError) as err:
        backfill_request_create(actor=personas["alice"], job="dwd_order_items", reason="x", cascade="cascade",
                                node_actions={"ads_unknown": "skip"}, **WEEK)
    assert "node_actions" in err.value.fields
    with pytest.raises(ValidationError) as err:
        backfill_request_create(actor=personas["alice"], job="dwd_order_items", reason="x", cascade="cascade",
                                node_actions={"notify_finance": "rebuild"}, **WEEK)
    assert "side_effects" in err.value.fields
    with pytest.raises(ValidationError) as err:
        backfill_request_create(actor=personas["alice"], job="dwd_order_items", reason="x",
                                side_effects=["dws_sales_daily"], **WEEK)
    assert "side_effects" in err.value.fields
    assert BackfillRequest.objects.count() == 0


def handoff_request(personas, ready):
    request, _ = backfill_request_create(actor=personas["alice"], job="dwd_order_items", reason="source fix",
                                         cascade="handoff", start="2022-10-01", end="2022-10-02")
    backfill_request_submit(actor=personas["alice"], request_id=request.pk, confirm_overlap=True)
    backfill_request_decide(actor=personas["olivia"], request_id=request.pk, approve=True)
    ready.drain()
    request.refresh_from_db()
    assert request.status == RequestStatus.RECONCILING
    return request


def test_handoff_accepted_files_a_linked_cascade_request(personas, ready):
    request = handoff_request(personas, ready)
    item = HandoffItem.objects.get(request=request)
    assert (item.job.name, item.owner.username, item.first_partition, item.last_partition) == \
        ("dws_sales_daily", "sam", "2022-10-01", "2022-10-02")
    with pytest.raises(PermissionDenied):
        handoff_accept(actor=personas["rita"], item_id=item.pk)
    item = handoff_accept(actor=personas["sam"], item_id=item.pk, comment="rebuild please")
    follow = BackfillRequest.objects.get(pk=item.follow_up_id)
    assert item.status == "accepted" and follow.parent_id == request.pk
    assert follow.requested_by.username == "sam" and follow.cascade == "cascade"
    assert follow.status == RequestStatus.PENDING_APPROVAL
    with pytest.raises(ConflictError):
        handoff_accept(actor=personas["sam"], item_id=item.pk)
    assert AuditEvent.objects.filter(action="handoff.accepted", object_id=str(item.pk)).count() == 1


def test_handoff_declined_and_one_that_expires(personas, ready):
    request = handoff_request(personas, ready)
    item = HandoffItem.objects.get(request=request)
    # Which item and whose it is come before the comment: an unknown id is a 404, and
    # someone else declining without a word an audited 403 (the exploratory test got 400s).
    with pytest.raises(NotFound):
        handoff_decline(actor=personas["sam"], item_id=999999, comment="")
    with pytest.raises(PermissionDenied):
        handoff_decline(actor=personas["alice"], item_id=item.pk, comment="")
    assert AuditEvent.objects.filter(action="denied.handoff.declined", actor_name="alice").exists()
    with pytest.raises(ValidationError):
        handoff_decline(actor=personas["sam"], item_id=item.pk, comment="  ")
    assert handoff_decline(actor=personas["sam"], item_id=item.pk, comment="numbers unchanged").status == "declined"

    second = handoff_request(personas, ready)
    late = HandoffItem.objects.get(request=second)
    assert handoffs_expire(now=timezone.now() + timedelta(days=30)) == 1
    late.refresh_from_db()
    assert late.status == "expired"
    with pytest.raises(ConflictError):
        handoff_accept(actor=personas["sam"], item_id=late.pk)
    assert AuditEvent.objects.filter(action="handoff.expired", object_id=str(late.pk)).exists()


def test_lineage_api_maps_partitions_across_grains(personas, catalog, api):
    body = api("audrey").get("/api/lineage/", {"root": "dwd_order_items", "start": "2022-10-30",
                                                "end": "2022-10-31"}).json()
    nodes = {n["job"]: n for n in body["nodes"]}
    assert nodes["dwd_order_items"]["layer"] == 0 and nodes["dws_sales_daily"]["layer"] == 1
    assert nodes["monthly_summary"]["partitions"] == ["2022-10"]  # 30-31 Oct Shanghai lie inside London's October
    assert nodes["notify_finance"]["side_effect"] is True
    assert api("audrey").get("/api/lineage/", {"root": "nope"}).status_code == 404
    assert api("audrey").get("/api/lineage/", {"root": "dwd_order_items", "start": "2022-10-30"}).status_code == 400


def test_approvals_inbox_lists_the_steps_waiting_for_me_and_decides_them(personas, catalog, api):
    request = file_cascade(personas)
    inbox = api("sam").get("/api/approvals/", {"mine": "1"}).json()["results"]
    assert [(s["dataset"], s["approver"], s["status"]) for s in inbox] == [("dws_sales_daily", "sam", "pending")]
    assert api("alice").get("/api/approvals/", {"mine": "1"}).json()["results"] == []  # never my own request
    refused = api("rita").post(f"/api/approvals/{inbox[0]['id']}/approve/", {}, format="json")
    assert refused.status_code == 403 and "sam" in refused.json()["detail"]
    decided = api("sam").post(f"/api/approvals/{inbox[0]['id']}/approve/", {"comment": "ok"}, format="json").json()
    assert (decided["status"], decided["decided_by"]) == ("approved", "sam")
    assert api("sam").get("/api/approvals/", {"mine": "1"}).json()["results"] == []
    twice = api("sam").post(f"/api/approvals/{inbox[0]['id']}/approve/", {}, format="json")
    assert twice.status_code == 409
    no_reason = api("olivia").post(
        f"/api/approvals/{ApprovalStep.objects.get(request=request, approver=personas['olivia']).pk}/reject/",
        {"comment": ""}, format="json")
    assert no_reason.status_code == 400 and "comment" in no_reason.json()["errors"]


@pytest.mark.parametrize("verb", ["accept", "decline"])
def test_a_handoff_comment_the_api_refuses_is_first_an_audited_403_for_someone_else(personas, ready, api, verb):
    item = HandoffItem.objects.get(request=handoff_request(personas, ready))
    too_long = {"comment": "x" * 5000}
    response = api("alice").post(f"/api/handoffs/{item.pk}/{verb}/", too_long, format="json")
    assert response.status_code == 403, response.content[:300]
    assert AuditEvent.objects.filter(action=f"denied.handoff.{verb.rstrip('e')}ed", actor_name="alice").count() == 1
    assert api("sam").post(f"/api/handoffs/999999/{verb}/", too_long, format="json").status_code == 404
    response = api("sam").post(f"/api/handoffs/{item.pk}/{verb}/", too_long, format="json")
    assert response.status_code == 400 and "comment" in response.json()["errors"], response.content[:300]
    item.refresh_from_db()
    assert item.status == "pending"
