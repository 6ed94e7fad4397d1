"""Pages offer exactly what the services allow (issue #14 item 6).

A table over personas x actions x request states. For each cell the page is rendered
for that persona and asked whether it offers the action (its form, or an enabled
button, is in the HTML), and the action's service is called as that persona: the page
must offer it exactly when the service succeeds. A service that refuses
(PermissionDenied) or says "not now" (a 409/400/404 for the request's state) must not
be offered; one that succeeds must be.

An action that only writes the metadata database is tried in a transaction rolled back
afterwards, so every persona meets the same state; one that moves a warehouse pointer
(a rollback) cannot be undone that way, so a success spends the state and the next
cell gets it built again.

Two cells changed with backfills/policy.py (the pages had drifted from the services):
a cascade owner is offered Explain and Recompute on the reconciliation page (the
service always accepted them), and the target owner of a cascade request is no longer
offered its rollback (the service needs the owner of every dataset it published).
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from django.db import transaction
from django.test import Client

from backfill_portal.backfills.choices import IntervalStatus, RequestStatus, StepStatus
from backfill_portal.backfills.models import ApprovalStep, BackfillRequest, HandoffItem, Interval, ReconciliationRow
from backfill_portal.backfills.services.handoff import handoff_accept, handoff_decline, handoffs_open_for
from backfill_portal.backfills.services.requests import (
    approval_step_decide,
    backfill_request_cancel,
    backfill_request_create,
    backfill_request_decide,
    backfill_request_submit,
)
from backfill_portal.backfills.transitions import interval_transition, request_transition
from backfill_portal.core.errors import ApplicationError, PermissionDenied
from backfill_portal.backfills.services.lifecycle import request_pause, request_resume
from backfill_portal.backfills.services.requests import request_start_after_approval
from backfill_portal.execution.services.dispatch import request_retry_failed
from backfill_portal.recovery.reconciliation import (
    interval_explain,
    reconciliation_get,
    reconciliation_recompute,
    reconciliation_signoff,
)
from backfill_portal.recovery.rollback import partition_rollback, request_rollback
from tests.reconciliation.helpers import DOUBLED_SQL, deploy, run_request

PERSONAS = ("alice", "olivia", "sam", "rita", "finn", "oscar", "audrey", "outsider", "admin")
JOB = "dwd_order_items"
REASON = "late order events from the payment gateway"
# A cascade from dwd_order_items rebuilds dws_sales_daily (sam's); monthly_summary (rita's)
# and notify_finance (finn's side-effect node) are skipped.
CASCADE = {"cascade": "cascade", "node_actions": {"monthly_summary": "skip"}}
# Shanghai days the demo sources cover with the UTC days around them: one per build.
DAYS = [f"2022-09-{d}" for d in (29, 30)] + [f"2022-10-0{d}" for d in range(1, 8)]


# -- the actions: where the page offers each, and its service ------------------------------


@dataclass
class Action:
    name: str
    url: Callable[[dict], str]  # the page that would offer it
    offered: Callable[[str, dict], bool]  # is it offered in that page's HTML?
    call: Callable[[object, dict], object]  # the service, as this user
    undoable: bool = True  # metadata only: tried in a transaction rolled back afterwards
    applies: Callable[[dict], bool] = lambda ctx: True


def detail(ctx) -> str:
    return f"/requests/{ctx['request'].pk}/"


def recon(ctx) -> str:
    return f"/requests/{ctx['request'].pk}/reconciliation/"


def inbox(ctx) -> str:
    return "/approvals/"


def posts_to(path: Callable[[dict], str], attr: str = "action"):
    return lambda html, ctx: f'{attr}="{path(ctx)}"' in html


def request_path(verb: str):
    return lambda ctx: f"/requests/{ctx['request'].pk}/{verb}/"


def resume_offered(html: str, ctx: dict) -> bool:
    # request_resume on a failed request retries its failed intervals (its docstring and
    # the API say so): for a failed request, the page's "Retry failed intervals" is that offer.
    if ctx["request"].status == RequestStatus.FAILED:
        return posts_to(request_path("retry"))(html, ctx)
    return posts_to(request_path("resume"))(html, ctx)


def explain_path(ctx) -> str:
    row = ctx.get("row")
    return f"/requests/{ctx['request'].pk}/reconciliation/rows/{row.pk if row else ''}"


def explain_offered(html: str, ctx: dict) -> bool:
    if ctx.get("row") is None:  # nothing to explain yet: no explain form at all
        return "/explain/" in html
    return f'action="{explain_path(ctx)}/explain/"' in html


def explain(user, ctx):
    row = ctx.get("row")
    if row is None:
        first = Interval.objects.filter(request=ctx["request"]).order_by("position").first()
        return interval_explain(actor=user, request_id=ctx["request"].pk, partition_key=first.partition_key,
                                explanation="late events landed twice")
    return interval_explain(actor=user, request_id=ctx["request"].pk, partition_key=row.partition_key,
                            job=row.job.name, explanation="late events landed twice")


def signoff_offered(html: str, ctx: dict) -> bool:
    form = re.search(r'<form method="post" action="%s">.*?</form>' % re.escape(recon(ctx) + "signoff/"), html, re.S)
    return form is not None and not re.search(r"<button[^>]*\bdisabled\b", form.group(0))


def rid(ctx) -> int:
    return ctx["request"].pk


REQUEST_ACTIONS = [
    Action("submit", detail, posts_to(request_path("submit")),
           lambda u, c: backfill_request_submit(actor=u, request_id=rid(c), confirm_overlap=True)),
    Action("approve", detail, posts_to(request_path("approve")),
           lambda u, c: backfill_request_decide(actor=u, request_id=rid(c), approve=True, comment="checked")),
    Action("reject", detail, posts_to(request_path("reject"), "formaction"),
           lambda u, c: backfill_request_decide(actor=u, request_id=rid(c), approve=False, comment="wrong range")),
    Action("cancel", detail, posts_to(request_path("cancel")),
           lambda u, c: backfill_request_cancel(actor=u, request_id=rid(c), reason="not needed")),
    Action("pause", detail, posts_to(request_path("pause")), lambda u, c: request_pause(actor=u, request_id=rid(c))),
    Action("resume", detail, resume_offered, lambda u, c: request_resume(actor=u, request_id=rid(c))),
    Action("retry", detail, posts_to(request_path("retry")),
           lambda u, c: request_retry_failed(actor=u, request_id=rid(c))),
    Action("rollback", detail, posts_to(request_path("rollback")),
           lambda u, c: request_rollback(actor=u, request_id=rid(c), reason="amounts doubled"), undoable=False),
    # The page offers an explanation on each row whose numbers differ. The service would
    # also take one for a matched row (which stays matched); no page offers that, so a
    # state whose rows all matched has no explain cell.
    Action("explain", recon, explain_offered, explain, applies=lambda ctx: not ctx.get("all_matched")),
    Action("recompute", recon, posts_to(lambda c: recon(c) + "recompute/"),
           lambda u, c: reconciliation_recompute(actor=u, request_id=rid(c))),
    Action("signoff", recon, signoff_offered,
           lambda u, c: reconciliation_signoff(actor=u, request_id=rid(c), comment="numbers match")),
]


def step_actions(ctx) -> list[Action]:
    """Deciding each approval step from the approvals inbox."""
    actions = []
    for step in ctx.get("steps", []):
        def call(user, c, pk=step.pk):
            fresh = ApprovalStep.objects.select_related("request__job__dataset", "dataset", "approver").get(pk=pk)
            return approval_step_decide(actor=user, step=fresh, approve=True, comment="checked")

        actions.append(Action(f"approve step #{step.pk} ({step.kind}, {step.approver or 'any admin'})", inbox,
                              posts_to(lambda c, pk=step.pk: f"/approvals/steps/{pk}/decide/"), call))
    for item in ctx.get("handoffs", []):
        offered = posts_to(lambda c, pk=item.pk: f"/approvals/handoffs/{pk}/decide/")
        actions.append(Action(f"accept hand-off #{item.pk}", inbox, offered,
                              lambda u, c, pk=item.pk: handoff_accept(actor=u, item_id=pk, comment="rebuild it")))
        actions.append(Action(f"decline hand-off #{item.pk}", inbox, offered,
                              lambda u, c, pk=item.pk: handoff_decline(actor=u, item_id=pk, comment="not needed")))
    return actions


# -- the table ----------------------------------------------------------------------------------


class _Undo(Exception):
    pass


def outcome(action: Action, user, ctx: dict) -> str:
    try:
        if action.undoable:
            with transaction.atomic():
                action.call(user, ctx)
                raise _Undo
        action.call(user, ctx)
    except _Undo:
        pass
    except PermissionDenied:
        return "refused"
    except ApplicationError as exc:
        return f"not now ({exc.status_code}: {exc.message[:80]})"
    return "allowed"


class World:
    """One request in one state; built again when a cell spent it."""

    def __init__(self, personas, build: Callable[[], dict]):
        self.personas, self.build = personas, build
        self.ctx: dict | None = None
        self.pages: dict = {}
        self.builds = 0

    def fresh(self) -> dict:
        if self.ctx is None:
            self.ctx, self.pages = self.build(), {}
            self.builds += 1
        return self.ctx

    def page(self, persona: str, url: str) -> str:
        if (persona, url) not in self.pages:
            client = Client()
            client.force_login(self.personas[persona])
            response = client.get(url)
            assert response.status_code == 200, (persona, url, response.status_code)
            self.pages[(persona, url)] = response.content.decode()
        return self.pages[(persona, url)]


def compare(world: World, actions: Callable[[dict], list[Action]], state: str) -> dict:
    """{(action, persona): (offered, outcome)}; fails naming every cell where they disagree."""
    table, wrong = {}, []
    for i in range(len(actions(world.fresh()))):
        for persona in PERSONAS:
            ctx = world.fresh()
            action = actions(ctx)[i]
            if not action.applies(ctx):
                continue
            offered = action.offered(world.page(persona, action.url(ctx)), ctx)
            result = outcome(action, world.personas[persona], ctx)
            if result == "allowed" and not action.undoable:
                world.ctx = None
            table[(action.name, persona)] = (offered, result)
            if offered != (result == "allowed"):
                wrong.append(f"{state}: {action.name} as {persona}: the page {'offers' if offered else 'hides'} it, "
                             f"the service says {result}")
    assert not wrong, "\n".join(wrong)
    return table


def allowed_to(table: dict, action: str) -> set[str]:
    return {p for (a, p), (_, result) in table.items() if a == action and result == "allowed"}


# -- states without runs ------------------------------------------------------------------------


def file(personas, *, requester="alice", days=(DAYS[2], DAYS[3]), **kwargs) -> BackfillRequest:
    request, _ = backfill_request_create(actor=personas[requester], job=JOB, start=days[0], end=days[1],
                                         reason=REASON, **kwargs)
    return request


def submitted(personas, requester="alice", **kwargs) -> BackfillRequest:
    request = file(personas, requester=requester, **kwargs)
    backfill_request_submit(actor=personas[requester], request_id=request.pk, confirm_overlap=True)
    return request


def approved(personas, **kwargs) -> BackfillRequest:
    request = submitted(personas, **kwargs)
    for step in request.approval_steps.filter(status=StepStatus.PENDING).select_related("approver"):
        backfill_request_decide(actor=step.approver or personas["admin"], request_id=request.pk, approve=True)
    return request


def running(personas, *, paused=False, failed=False, request_failed=False) -> BackfillRequest:
    request = approved(personas, **CASCADE)
    request_start_after_approval(request_id=request.pk)  # approval's on_commit does not run in this test
    if paused:
        request_pause(actor=personas["alice"], request_id=request.pk)
    if failed or request_failed:
        interval = Interval.objects.filter(request=request, job__name=JOB).order_by("position").first()
        interval_transition(interval, to=IntervalStatus.QUEUED, reason="test: dispatched")
        interval_transition(interval, to=IntervalStatus.FAILED, reason="test: the worker died")
    if request_failed:
        request_transition(BackfillRequest.objects.get(pk=request.pk), to=RequestStatus.FAILED, actor=None,
                           reason="test: an interval failed")
    return request


def rejected(personas) -> BackfillRequest:
    request = submitted(personas, **CASCADE)
    backfill_request_decide(actor=personas["olivia"], request_id=request.pk, approve=False, comment="wrong range")
    return request


def cancelled(personas) -> BackfillRequest:
    request = submitted(personas, **CASCADE)
    backfill_request_cancel(actor=personas["alice"], request_id=request.pk, reason="not needed")
    return request


def handoff(personas) -> BackfillRequest:
    request = approved(personas, cascade="handoff")
    handoffs_open_for(request_id=request.pk)  # what reaching reconciling does; opened here directly
    return request


UNRUN_STATES = {
    "draft (cascade)": lambda p: file(p, **CASCADE),
    "pending approval (cascade: olivia's and sam's steps)": lambda p: submitted(p, **CASCADE),
    "pending approval (olivia filed on her own dataset: an admin step)": lambda p: submitted(p, requester="olivia"),
    "approved": lambda p: approved(p, **CASCADE),
    "approved (hand-off items open)": handoff,
    "running": running,
    "running, paused": lambda p: running(p, paused=True),
    "running, an interval failed": lambda p: running(p, failed=True),
    "failed": lambda p: running(p, request_failed=True),
    "rejected": rejected,
    "cancelled": cancelled,
}


def context(request: BackfillRequest) -> dict:
    request = BackfillRequest.objects.get(pk=request.pk)
    row = None
    if request.status in (RequestStatus.RECONCILING, RequestStatus.COMPLETED, RequestStatus.ROLLED_BACK):
        reconciliation_get(request_id=request.pk)
        rows = ReconciliationRow.objects.filter(request=request).select_related("job").order_by("job_id", "position")
        row = next((r for r in rows if r.deviations), None)
    return {
        "request": request, "row": row, "all_matched": row is None and bool(request.status == RequestStatus.RECONCILING),
        "steps": list(ApprovalStep.objects.filter(request=request, status=StepStatus.PENDING).order_by("pk")),
        "handoffs": list(HandoffItem.objects.filter(request=request).order_by("pk")),
    }


def all_actions(ctx: dict) -> list[Action]:
    return REQUEST_ACTIONS + step_actions(ctx)


@pytest.mark.parametrize("state", list(UNRUN_STATES))
def test_pages_offer_what_the_services_allow_before_anything_ran(personas, catalog, warehouse, state):
    world = World(personas, lambda: context(UNRUN_STATES[state](personas)))
    table = compare(world, all_actions, state)
    if state.startswith("pending approval (cascade"):
        assert allowed_to(table, "approve") == {"olivia", "sam"}
    if state.startswith("pending approval (olivia"):
        assert allowed_to(table, "approve") == {"admin"}
    if state == "running, an interval failed":
        assert allowed_to(table, "retry") == {"alice", "oscar", "admin"}
    if state.startswith("approved (hand-off"):
        assert {p for (a, p), (_, r) in table.items() if a.startswith("accept hand-off") and r == "allowed"} == {"sam"}


# -- states after runs published: rollback, reconciliation -----------------------------------------


@pytest.fixture
def published(personas, pipeline):
    """Builds requests that ran: each build on a day of its own (a rollback moved the
    pointers of the days before)."""
    days = iter(DAYS)

    def run(*, cascade: bool, doubled: bool, explained=False, signed=False, rolled_back=False) -> dict:
        day = next(days)
        kwargs = dict(start=day, end=day, **(CASCADE if cascade else {}))
        deploy()
        run_request(personas, pipeline, **kwargs)
        if doubled:
            deploy(dwd_sql=DOUBLED_SQL)
        request = run_request(personas, pipeline, **kwargs)
        deploy()
        assert request.status == RequestStatus.RECONCILING, request.status
        reconciliation_get(request_id=request.pk)
        if explained or signed:
            for row in ReconciliationRow.objects.filter(request=request, verdict="unexplained").select_related("job"):
                interval_explain(actor=personas["alice"], request_id=request.pk, partition_key=row.partition_key,
                                 job=row.job.name, explanation="the doubled run, reverted since")
        if signed:
            reconciliation_signoff(actor=personas["olivia"], request_id=request.pk, comment="numbers match")
        if rolled_back:
            request_rollback(actor=personas["oscar"], request_id=request.pk, reason="amounts doubled")
        return {**context(request), "day": day}

    return run


RAN_STATES = {
    "reconciling (cascade, intervals unexplained)": dict(cascade=True, doubled=True),
    "reconciling (cascade, every interval explained)": dict(cascade=True, doubled=True, explained=True),
    "completed (cascade, signed off)": dict(cascade=True, doubled=True, signed=True),
    "rolled back (cascade)": dict(cascade=True, doubled=True, rolled_back=True),
    "reconciling (no cascade, numbers matched)": dict(cascade=False, doubled=False),
}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("state", list(RAN_STATES))
def test_pages_offer_what_the_services_allow_once_runs_published(personas, published, state):
    world = World(personas, lambda: published(**RAN_STATES[state]))
    table = compare(world, lambda ctx: REQUEST_ACTIONS, state)
    if state == "reconciling (cascade, intervals unexplained)":
        # sam owns dws_sales_daily, which the cascade rebuilt: he reviews (the page hid it before).
        assert {"sam", "olivia", "alice", "oscar", "admin"} <= allowed_to(table, "explain")
        assert table[("explain", "sam")] == (True, "allowed") and table[("recompute", "sam")] == (True, "allowed")
        # The request published olivia's and sam's datasets: neither alone rolls it back
        # (the page offered it to olivia, the target owner, before).
        assert allowed_to(table, "rollback") == {"oscar", "admin"}
        assert table[("rollback", "olivia")] == (False, "refused")
        assert world.builds == 3  # each allowed rollback spent the state once
    if state == "reconciling (cascade, every interval explained)":
        assert allowed_to(table, "signoff") == {"olivia"}
    if state == "reconciling (no cascade, numbers matched)":
        assert allowed_to(table, "rollback") == {"olivia", "oscar", "admin"}
        assert allowed_to(table, "signoff") == {"olivia"}


def test_the_table_fails_when_a_page_and_its_service_disagree(personas, catalog, warehouse):
    """Guard: a page that offered cancel to everyone, or hid it from everyone, is caught."""
    world = World(personas, lambda: context(submitted(personas)))
    cancel = next(a for a in REQUEST_ACTIONS if a.name == "cancel")
    for offered in (lambda html, ctx: True, lambda html, ctx: False):
        forged = Action("cancel", cancel.url, offered, cancel.call)
        with pytest.raises(AssertionError) as failure:
            compare(world, lambda ctx: [forged], "pending approval")
        text = str(failure.value)
        assert ("cancel as outsider: the page offers it, the service says refused" in text
                or "cancel as alice: the page hides it, the service says allowed" in text), text


# -- the partition page ------------------------------------------------------------------------------


def partition_actions(ctx) -> list[Action]:
    page = f"/datasets/{JOB}/partitions/{ctx['day']}/"
    return [Action("roll back the partition", lambda c: page, posts_to(lambda c: page + "rollback/", "href"),
                   lambda u, c: partition_rollback(actor=u, dataset=JOB, partition_key=c["day"],
                                                   reason="amounts doubled"), undoable=False)]


@pytest.mark.django_db(transaction=True)
def test_the_partition_page_offers_its_rollback_to_whom_the_service_allows(personas, published):
    world = World(personas, lambda: published(cascade=False, doubled=True))
    table = compare(world, partition_actions, "a partition with a previous verified version")
    assert allowed_to(table, "roll back the partition") == {"olivia", "oscar", "admin"}

    def rolled_back():
        ctx = published(cascade=False, doubled=True)
        partition_rollback(actor=personas["oscar"], dataset=JOB, partition_key=ctx["day"], reason="amounts doubled")
        return ctx

    table = compare(World(personas, rolled_back), partition_actions, "a partition rolled back already")
    assert allowed_to(table, "roll back the partition") == set()
