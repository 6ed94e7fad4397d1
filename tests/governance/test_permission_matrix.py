"""The permission matrix (issue 4, "Must show"): every role x every action, through the
API (DRF's APIClient.force_authenticate) and through the web pages (Django's Client
.force_login, real form POSTs; the test client skips CSRF, and one test below shows a
POST without the token is refused when CSRF is enforced).

Allowed: the success code (201/200 from the API, the post/redirect/get 302 from the web),
the state moved, and the change is audited under that actor. Refused: 403 (the API's
JSON, the web's 403 page) carrying the reason, the state did not move, and exactly one
new AuditEvent "denied.<action>" for that actor.

The expected cells are derived from the services (the one place that decides):
- create          backfills.services.requests.backfill_request_create: requester, owner, on-call, admin
- submit          backfill_request_submit: the requester who filed it, or an admin
- approve/reject  approval_step_decide: only the step's approver (the target owner for the owner step);
                  never the requester (separation of duties), and an admin only for admin steps
- cancel          backfill_request_cancel: the requester who filed it, on-call, an admin
- rollback        recovery.rollback._require_operator: on-call, an admin, or the owner of
                  every dataset involved (partition and request alike)
- sign off        recovery.reconciliation._may_sign_off: the target owner (an admin only
                  when the owner filed the request themselves)
- read audit      web.api.audit_and_tokens.AuditEventViewSet / web.pages.home.audit: every authenticated user;
                  anonymous is refused (API) or sent to the login page (web)

Where the code disagrees with DESIGN.md's doctrine, the cell is written per the doctrine and
marked xfail(strict=True): see DOCTRINE_DISAGREES.

A refused cell is one test that tries both channels against one state (a refusal changes
nothing, so the state is still the one under test); an allowed cell is one test per
channel, each on a state of its own. The request rollback has no web page yet
(web_urls.py only has the partition's rollback confirmation): API only (NO_WEB_ROUTE).
"""
from __future__ import annotations

import uuid
from datetime import date
from functools import lru_cache

import pytest
import yaml
from django.test import Client
from django.utils.html import escape
from rest_framework.test import APIClient

from backfill_portal.backfills.choices import RequestStatus, StepKind, StepStatus
from backfill_portal.backfills.models import ApprovalStep, BackfillRequest, Reconciliation
from backfill_portal.backfills.services.requests import backfill_request_create, backfill_request_submit
from backfill_portal.catalog.services.sync import catalog_sync
from backfill_portal.core.errors import PermissionDenied
from backfill_portal.core.models import AuditEvent
from backfill_portal.core.roles import Role
from backfill_portal.execution.models import Run
from backfill_portal.warehouse.models import Publication
from tests.conftest import TEST_CATALOG, make_user

# -- the matrix -------------------------------------------------------------------------

ROLES = {  # matrix role -> persona (tests/conftest.py; bob is added here)
    "filer": "alice",  # the requester who filed the request under test
    "other_requester": "bob",  # a requester who did not file it
    "target_owner": "olivia",  # owns dwd_order_items, the target
    "other_owner": "sam",  # owns dws_sales_daily, not the target
    "oncall": "oscar",
    "auditor": "audrey",
    "outsider": "outsider",  # signed in, no role
    "admin": "admin",  # superuser
}
EVERYONE = frozenset(ROLES)

ALLOWED: dict[str, frozenset[str]] = {
    "create": EVERYONE - {"auditor", "outsider"},
    "submit": frozenset({"filer", "admin"}),
    "approve_step": frozenset({"target_owner"}),
    "reject_step": frozenset({"target_owner"}),
    "cancel": frozenset({"filer", "oncall", "admin"}),
    "rollback_partition": frozenset({"target_owner", "oncall", "admin"}),
    "rollback_request": frozenset({"target_owner", "oncall", "admin"}),
    "signoff": frozenset({"target_owner"}),
    "read_audit": EVERYONE,
}

# What the service writes when it refuses ("denied." + this).
DENIED_ACTION = {
    "create": "request.create",
    "submit": "request.submit",
    "approve_step": "approval.approve",
    "reject_step": "approval.reject",
    "cancel": "request.cancel",
    "rollback_partition": "partition.rollback",
    "rollback_request": "request.rollback",
    "signoff": "reconciliation.signoff",
}

# (action, role) -> why the doctrine and the code disagree; the cell expects the doctrine.
DOCTRINE_DISAGREES: dict[tuple[str, str], str] = {}

NO_WEB_ROUTE = {"rollback_request": "no web route for a request rollback yet (web_urls.py)"}

FAST_ACTIONS = ["create", "submit", "approve_step", "reject_step", "cancel"]
PIPELINE_ACTIONS = ["rollback_partition", "rollback_request", "signoff"]

JOB = DATASET = "dwd_order_items"
RANGE = dict(start="2022-10-01", end="2022-10-03")
DAY = "2022-10-01"
REASON = "late order events from the payment gateway"


def expected(action: str, role: str) -> bool:
    allowed = role in ALLOWED[action]
    return (not allowed) if (action, role) in DOCTRINE_DISAGREES else allowed


def cells(actions):
    """(action, role, allowed, channels): a refused cell tries every channel on one
    state; an allowed cell is one test per channel."""
    for action in actions:
        channels = ("api",) if action in NO_WEB_ROUTE else ("api", "web")
        for role in ROLES:
            allowed = expected(action, role)
            marks = []
            if (action, role) in DOCTRINE_DISAGREES:
                marks.append(pytest.mark.xfail(strict=True, reason=DOCTRINE_DISAGREES[(action, role)]))
            verdict = "allowed" if allowed else "denied"
            for group in ([(c,) for c in channels] if allowed else [channels]):
                yield pytest.param(action, role, allowed, group, marks=marks,
                                   id=f"{action}-{role}-{verdict}-{'+'.join(group)}")


# -- people, catalog, clients -------------------------------------------------------------


@lru_cache(maxsize=1)
def slim_catalog() -> str:
    """The test catalog cut to what the matrix needs (the target, its source, and one
    dataset another owner owns): the same rules, a third of the sync time per test."""
    doc = yaml.safe_load(TEST_CATALOG)
    keep = {"ods_order_events", "dwd_order_items", "dws_sales_daily"}
    doc["datasets"] = [d for d in doc["datasets"] if d["name"] in keep]
    doc["jobs"] = [j for j in doc["jobs"] if j["name"] in keep]
    return yaml.safe_dump(doc, sort_keys=False)


@pytest.fixture
def people(personas):
    """The personas, bob (a second requester), and the slim catalog they own."""
    people = {**personas, "bob": make_user("bob", [Role.REQUESTER])}
    catalog_sync(text=slim_catalog())
    return people


def client_for(channel: str, user):
    if channel == "api":
        client = APIClient()
        client.force_authenticate(user)
    else:
        client = Client()
        client.force_login(user)
    return client


# -- small factories ---------------------------------------------------------------------


def draft(people, requester="alice", **kwargs) -> BackfillRequest:
    request, _ = backfill_request_create(actor=people[requester], job=JOB, reason=REASON, **{**RANGE, **kwargs})
    return request


def pending(people, requester="alice", **kwargs) -> BackfillRequest:
    request = draft(people, requester, **kwargs)
    backfill_request_submit(actor=people[requester], request_id=request.pk, confirm_overlap=True)
    return BackfillRequest.objects.get(pk=request.pk)


def published_twice(people, queue) -> dict:
    """Two requests by alice, approved by olivia, run through the real pipeline on DAY: the
    second one is reconciling and its version replaced the first one's (the rollback target)."""
    from tests.execution.test_pipeline import approved_request

    run_ids = []
    for _ in range(2):
        request = approved_request(people, start=DAY, end=DAY)
        queue.drain()
        request.refresh_from_db()
        assert request.status == RequestStatus.RECONCILING, request.status
        run_ids.append(Run.objects.get(request=request).run_id)
    return {"request": request, "first_run": run_ids[0], "second_run": run_ids[1]}


# -- the actions: how each channel does it, and what it changes -----------------------------


def perform(action: str, channel: str, client, ctx: dict):
    api = channel == "api"
    request = ctx.get("request")
    if action == "create":
        if api:
            return client.post("/api/requests/", {"job": JOB, "reason": REASON, **RANGE}, format="json")
        return client.post("/requests/new/", {
            "job": JOB, "reason": REASON, **RANGE, "cascade": "none", "strategy": "forward",
            "max_active_intervals": 4, "idempotency_key": uuid.uuid4().hex, "action": "create"})
    if action == "submit":
        if api:
            return client.post(f"/api/requests/{request.pk}/submit/", {}, format="json")
        return client.post(f"/requests/{request.pk}/submit/", {})
    if action in ("approve_step", "reject_step"):
        verb, step = action.split("_")[0], ctx["step"]
        if api:
            return client.post(f"/api/approvals/{step.pk}/{verb}/", {"comment": "checked the plan"}, format="json")
        return client.post(f"/approvals/steps/{step.pk}/decide/", {"decision": verb, "comment": "checked the plan"})
    if action == "cancel":
        if api:
            return client.post(f"/api/requests/{request.pk}/cancel/", {"reason": "not needed"}, format="json")
        return client.post(f"/requests/{request.pk}/cancel/", {"reason": "not needed"})
    if action == "rollback_partition":
        if api:
            return client.post(f"/api/datasets/{DATASET}/partitions/{DAY}/rollback/", {"reason": "amounts doubled"},
                               format="json")
        return client.post(f"/datasets/{DATASET}/partitions/{DAY}/rollback/", {"reason": "amounts doubled"})
    if action == "rollback_request":
        assert api, NO_WEB_ROUTE[action]
        return client.post(f"/api/requests/{request.pk}/rollback/", {"reason": "amounts doubled"}, format="json")
    if action == "signoff":
        if api:
            return client.post(f"/api/requests/{request.pk}/signoff/", {"comment": "numbers match"}, format="json")
        return client.post(f"/requests/{request.pk}/reconciliation/signoff/", {"comment": "numbers match"})
    raise AssertionError(action)


def snapshot(action: str, ctx: dict, user, warehouse=None) -> tuple:
    """The state the action would change."""
    if action == "create":
        return tuple(BackfillRequest.objects.filter(requested_by=user).values_list("pk", "status"))
    request = BackfillRequest.objects.get(pk=ctx["request"].pk)
    state = (request.status,)
    if "step" in ctx:
        state += tuple(ctx["request"].approval_steps.order_by("pk").values_list("status", "decided_by_id"))
    if warehouse is not None:
        state += (warehouse.current(DATASET, DAY),
                  Publication.objects.filter(action=Publication.Action.ROLLBACK).count(),
                  Reconciliation.objects.filter(request=request, signed_off_at__isnull=False).count())
    return state


def assert_done(action: str, ctx: dict, user, before: tuple, warehouse=None):
    """The state moved as the action says."""
    if action == "create":
        mine = BackfillRequest.objects.filter(requested_by=user).order_by("pk")
        assert mine.count() == len(before) + 1
        assert mine.last().status == RequestStatus.DRAFT
        return
    request = BackfillRequest.objects.get(pk=ctx["request"].pk)
    if action == "submit":
        assert request.status == RequestStatus.PENDING_APPROVAL
        assert request.approval_steps.filter(kind=StepKind.OWNER, approver__username="olivia").exists()
    elif action in ("approve_step", "reject_step"):
        step = ctx["step"]
        step.refresh_from_db()
        decided = StepStatus.APPROVED if action == "approve_step" else StepStatus.REJECTED
        assert (step.status, step.decided_by_id) == (decided, user.pk)
        assert request.status == (RequestStatus.APPROVED if action == "approve_step" else RequestStatus.REJECTED)
    elif action == "cancel":
        assert request.status == RequestStatus.CANCELLED
        assert not request.approval_steps.filter(status=StepStatus.PENDING).exists()
    elif action == "signoff":
        assert request.status == RequestStatus.COMPLETED
        assert Reconciliation.objects.get(request=request).signed_off_by_id == user.pk
        assert warehouse.current(DATASET, DAY) == ctx["second_run"]
    else:  # a rollback: readers see the first version again
        assert warehouse.current(DATASET, DAY) == ctx["first_run"]
        assert Publication.objects.get(action=Publication.Action.ROLLBACK).actor_id == user.pk
        assert request.status == (RequestStatus.ROLLED_BACK if action == "rollback_request"
                                  else RequestStatus.RECONCILING)


def audit_mark() -> int:
    return AuditEvent.objects.order_by("-id").values_list("id", flat=True).first() or 0


def assert_refused(response, channel: str, user, action: str, mark: int):
    """403 with the reason, and the refusal (only it) in the audit log under that actor."""
    body = response.content.decode()
    assert response.status_code == 403, (channel, response.status_code, body[:1500])
    events = list(AuditEvent.objects.filter(id__gt=mark))
    # Rendering the reconciliation page after a refused sign-off may compute it (as the system).
    events = [e for e in events if not (e.action == "reconciliation.compute" and e.actor_id is None)]
    assert [(e.actor_id, e.action) for e in events] == [(user.pk, "denied." + DENIED_ACTION[action])], (
        channel, [(e.actor_name, e.action) for e in events])
    reason = events[0].reason
    assert reason
    if channel == "api":
        assert response.json() == {"detail": reason, "code": "permission_denied"}
    else:
        assert escape(reason) in body, (reason, body[:1500])


def assert_succeeded(response, channel: str, user, mark: int, code: int = 200):
    body = response.content.decode()
    if channel == "api":
        assert response.status_code == code, (response.status_code, body[:1500])
    else:  # post/redirect/get
        assert response.status_code == 302, (response.status_code, body[:1500])
        assert not response["Location"].startswith("/login/")
    new = AuditEvent.objects.filter(id__gt=mark)
    assert not new.filter(action__startswith="denied.").exists()
    assert new.filter(actor=user).exists()  # the change is audited under the actor


def check_cell(people, action, role, allowed, channels, make, warehouse=None):
    user = people[ROLES[role]]
    if allowed:
        (channel,) = channels
        ctx = make()
        before = snapshot(action, ctx, user, warehouse)
        mark = audit_mark()
        response = perform(action, channel, client_for(channel, user), ctx)
        assert_succeeded(response, channel, user, mark, 201 if (action, channel) == ("create", "api") else 200)
        assert_done(action, ctx, user, before, warehouse)
        return
    ctx = make()
    before = snapshot(action, ctx, user, warehouse)
    for channel in channels:
        mark = audit_mark()
        response = perform(action, channel, client_for(channel, user), ctx)
        assert_refused(response, channel, user, action, mark)
        assert snapshot(action, ctx, user, warehouse) == before, channel


# -- the cells: drafts and pending requests (no pipeline) ----------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("action, role, allowed, channels", list(cells(FAST_ACTIONS)))
def test_request_and_approval_matrix(people, action, role, allowed, channels):
    def make() -> dict:
        if action == "create":
            return {}
        if action == "submit":
            return {"request": draft(people)}
        request = pending(people)
        step = request.approval_steps.get()
        assert (step.kind, step.approver) == (StepKind.OWNER, people["olivia"])
        return {"request": request, "step": step}

    check_cell(people, action, role, allowed, channels, make)


# -- the cells: rollback and sign-off on really published versions ------------------------


@pytest.fixture
def pipeline(people, warehouse, task_queue):
    """Source data for the Shanghai day DAY (the UTC days around it), small."""
    from backfill_portal.web.demo.sources import load_demo_sources

    load_demo_sources(warehouse, first=date(2022, 9, 30), last=date(2022, 10, 2), orders_per_day=20,
                      page_views_per_hour=1)
    return task_queue


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("action, role, allowed, channels", list(cells(PIPELINE_ACTIONS)))
def test_rollback_and_signoff_matrix(people, pipeline, warehouse, action, role, allowed, channels):
    def make() -> dict:
        ctx = published_twice(people, pipeline)
        assert warehouse.current(DATASET, DAY) == ctx["second_run"]
        return ctx

    check_cell(people, action, role, allowed, channels, make, warehouse)


# -- read the audit log ----------------------------------------------------------------------


@pytest.fixture
def some_history(people):
    """Events by several actors, a refusal among them."""
    pending(people)
    with pytest.raises(PermissionDenied):
        draft(people, requester="outsider")
    return AuditEvent.objects.count()


@pytest.mark.django_db
@pytest.mark.parametrize("role", [pytest.param(r, id=f"read_audit-{r}-allowed-api+web") for r in ROLES])
def test_every_signed_in_role_reads_the_whole_audit_log(people, some_history, role):
    assert role in ALLOWED["read_audit"]
    user = people[ROLES[role]]
    everything = set(AuditEvent.objects.values_list("id", flat=True))
    response = client_for("api", user).get("/api/audit/", {"page_size": 500})
    assert response.status_code == 200, response.content[:500]
    rows = response.json()["results"]
    assert {e["id"] for e in rows} == everything  # everyone's events, refusals included
    assert {"alice", "outsider"} <= {e["actor"] for e in rows}
    response = client_for("web", user).get("/audit/")
    assert response.status_code == 200
    page = response.content.decode()
    assert "request.submit" in page and "denied.request.create" in page
    assert AuditEvent.objects.count() == some_history  # reading is not an audited change


@pytest.mark.django_db
def test_anonymous_cannot_read_the_audit_log(some_history):
    response = APIClient().get("/api/audit/")
    assert response.status_code == 401, response.status_code  # with its challenge; it was "401 or 403"
    assert response["WWW-Authenticate"] == 'Token realm="api"'
    assert "results" not in response.json()
    response = Client().get("/audit/")
    assert response.status_code == 302
    assert response["Location"].startswith("/login/?next=")


# -- CSRF: a real browser's POST needs the token ----------------------------------------------


@pytest.mark.django_db
def test_web_post_without_csrf_token_is_403_and_changes_nothing(people):
    request = pending(people)
    client = Client(enforce_csrf_checks=True)
    client.force_login(people["alice"])  # the filer: the role would allow it
    mark = audit_mark()
    response = client.post(f"/requests/{request.pk}/cancel/", {"reason": "not needed"})
    assert response.status_code == 403
    request.refresh_from_db()
    assert request.status == RequestStatus.PENDING_APPROVAL
    assert audit_mark() == mark  # refused by the middleware: the view and the service never ran
    # With the page's token the same POST goes through: it was the token, not the role.
    assert client.get(f"/requests/{request.pk}/").status_code == 200
    response = client.post(f"/requests/{request.pk}/cancel/", {
        "reason": "not needed", "csrfmiddlewaretoken": client.cookies["csrftoken"].value})
    assert response.status_code == 302
    request.refresh_from_db()
    assert request.status == RequestStatus.CANCELLED


# -- taking a user's roles away ends what the relationships gave them -------------------------


@pytest.mark.django_db(transaction=True)
def test_a_user_whose_roles_were_removed_can_no_longer_approve_submit_cancel_sign_off_or_roll_back(
        people, pipeline, warehouse):
    """The exploratory test: with every group removed, olivia still approved, signed off
    and rolled back (as the step's approver, the dataset's owner), and alice still
    submitted and cancelled her request: the policy checked the relationship alone."""
    from django.contrib.auth import get_user_model

    ctx = published_twice(people, pipeline)
    waiting = pending(people)
    step = ApprovalStep.objects.get(request=waiting, approver=people["olivia"])
    mine = draft(people)
    User = get_user_model()
    for name in ("olivia", "alice"):
        User.objects.get(username=name).groups.clear()
    olivia, alice = User.objects.get(username="olivia"), User.objects.get(username="alice")
    mark = audit_mark()
    refused = [
        ("api", olivia, "approve_step", {"request": waiting, "step": step}),
        ("web", olivia, "approve_step", {"request": waiting, "step": step}),
        ("api", olivia, "signoff", ctx),
        ("api", olivia, "rollback_partition", ctx),
        ("api", olivia, "rollback_request", ctx),
        ("api", alice, "submit", {"request": mine}),
        ("api", alice, "cancel", {"request": waiting}),
    ]
    for channel, user, action, state in refused:
        before = snapshot(action, state, user, warehouse)
        response = perform(action, channel, client_for(channel, user), state)
        assert response.status_code == 403, (action, channel, response.status_code)
        assert snapshot(action, state, user, warehouse) == before, action
    assert AuditEvent.objects.filter(id__gt=mark, action__startswith="denied.").count() == len(refused)
    assert warehouse.current(DATASET, DAY) == ctx["second_run"]
    # Nothing waits for olivia in her inbox any more.
    page = client_for("web", olivia).get("/approvals/").content.decode()
    assert f'id="inbox-req-{waiting.pk}"' not in page


# -- a body the API refuses: someone without the right hears that first -----------------------

LONG = "x" * 5000  # past every comment's and reason's 4,000 characters

# action -> (URL under the pending request, the refused body, who may, the denied action)
BAD_BODIES = {
    "submit": ("/api/requests/{r}/submit/", {"confirm_overlap": "maybe"}, "alice", "request.submit"),
    "cancel": ("/api/requests/{r}/cancel/", {"reason": LONG}, "alice", "request.cancel"),
    "approve": ("/api/requests/{r}/approve/", {"comment": LONG}, "olivia", "approval.approve"),
    "reject": ("/api/requests/{r}/reject/", {"comment": LONG}, "olivia", "approval.reject"),
    "approve_step": ("/api/approvals/{s}/approve/", {"comment": LONG}, "olivia", "approval.approve"),
    "explain": (f"/api/requests/{{r}}/intervals/{DAY}/explain/", {"explanation": LONG}, "alice",
                "reconciliation.explain"),
    "signoff": ("/api/requests/{r}/signoff/", {"comment": LONG}, "olivia", "reconciliation.signoff"),
    "rollback_request": ("/api/requests/{r}/rollback/", {"reason": LONG}, "oscar", "request.rollback"),
    "rollback_partition": (f"/api/datasets/{DATASET}/partitions/{DAY}/rollback/", {"reason": LONG}, "oscar",
                           "partition.rollback"),
}


@pytest.mark.django_db
@pytest.mark.parametrize("action", list(BAD_BODIES))
def test_a_refused_body_from_someone_without_the_right_is_an_audited_403_and_a_400_for_whoever_has_it(
        people, action):
    """The exploratory test: a 5,000-character comment from someone who may not act was a
    400 about its length, so the attempt left no trace in the audit log."""
    path, body, rightful, denied = BAD_BODIES[action]
    request = pending(people)
    if action == "submit":
        request = draft(people)
    step = request.approval_steps.first()
    url = path.format(r=request.pk, s=step.pk if step else 0)
    before = snapshot("cancel", {"request": request}, None)
    mark = audit_mark()
    response = client_for("api", people["bob"]).post(url, body, format="json")
    assert response.status_code == 403, (response.status_code, response.content[:500])
    events = list(AuditEvent.objects.filter(id__gt=mark).values_list("actor__username", "action"))
    assert events == [("bob", "denied." + denied)]
    mark = audit_mark()
    response = client_for("api", people[rightful]).post(url, body, format="json")
    assert response.status_code == 400, (response.status_code, response.content[:500])
    assert set(response.json()["errors"]) == set(body), response.json()  # the field named
    assert audit_mark() == mark  # nothing refused, nothing done
    assert snapshot("cancel", {"request": request}, None) == before



# The same through the pages' forms: action -> (URL, form fields, who may, the denied action).
BAD_FORMS = {
    "approve": ("/requests/{r}/approve/", {"comment": LONG}, "olivia", "approval.approve"),
    "approve_step": ("/approvals/steps/{s}/decide/", {"decision": "approve", "comment": LONG}, "olivia",
                     "approval.approve"),
    "cancel": ("/requests/{r}/cancel/", {"reason": LONG}, "alice", "request.cancel"),
    "explain_many": ("/requests/{r}/reconciliation/explain/", {"explanation": LONG, "scope": "unexplained"}, "alice",
                     "reconciliation.explain"),
    "signoff": ("/requests/{r}/reconciliation/signoff/", {"comment": LONG}, "olivia", "reconciliation.signoff"),
    "rollback_request": ("/requests/{r}/rollback/", {"reason": LONG}, "oscar", "request.rollback"),
    # (The partition rollback page needs a published partition: a 404 here.)
}


@pytest.mark.django_db
@pytest.mark.parametrize("action", list(BAD_FORMS))
def test_an_invalid_form_from_someone_without_the_right_is_an_audited_403_and_refused_for_whoever_has_it(
        people, action):
    """The exploratory test: the pages read an invalid form's fields as blank, so a
    5,000-character approval comment was dropped and the step approved without it; and
    someone without the right got a form error instead of an audited refusal."""
    path, form, rightful, denied = BAD_FORMS[action]
    request = pending(people)
    step = request.approval_steps.get()
    url = path.format(r=request.pk, s=step.pk)
    before = snapshot("approve_step", {"request": request, "step": step}, None)
    mark = audit_mark()
    response = client_for("web", people["bob"]).post(url, form)
    assert response.status_code == 403, (response.status_code, response.content[:300])
    events = list(AuditEvent.objects.filter(id__gt=mark).values_list("actor__username", "action"))
    assert events == [("bob", "denied." + denied)]
    mark = audit_mark()
    response = client_for("web", people[rightful]).post(url, form)
    assert response.status_code == 400, (response.status_code, response.content[:300])
    assert "at most 4000 characters" in response.content.decode()
    assert not AuditEvent.objects.filter(id__gt=mark).exclude(action="reconciliation.compute").exists()
    assert snapshot("approve_step", {"request": request, "step": step}, None) == before  # nothing done
