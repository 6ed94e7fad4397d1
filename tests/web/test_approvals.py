"""The approvals inbox: what each persona is offered, decisions through
approval_step_decide (plain and htmx), refusals shown on the form, forged POSTs refused,
and hand-off items accepted or declined."""
from __future__ import annotations

import json

import pytest
from django.test import Client
from django.urls import reverse

from backfill_portal.backfills.models import ApprovalStep, BackfillRequest, HandoffItem
from backfill_portal.backfills.services.handoff import handoffs_open_for
from backfill_portal.core.models import AuditEvent

INBOX = "/approvals/"


def decide(step) -> str:
    return reverse("approval-step-decide", args=[step.pk])


def inbox_card(html: str, req) -> str:
    start = html.index(f'id="inbox-req-{req.pk}"')
    return html[start:html.index("</article>", start)]


@pytest.fixture
def cascade(make_request):
    return make_request("pending", cascade="cascade", start="2022-10-01", end="2022-10-07")


def test_each_owner_sees_their_step_with_the_plan_and_the_lineage_picture(web, cascade):
    for owner, subject in (("olivia", "dwd_order_items"), ("sam", "dws_sales_daily"), ("rita", "monthly_summary")):
        html = web(owner).get(INBOX).content.decode()
        card = inbox_card(html, cascade)
        assert f"{subject}" in card and "2022-10-01 → 2022-10-07" in card and "(Asia/Shanghai)" in card
        assert "7 daily" in card and "(23 with the cascade)" in card  # 7 dwd + 7 dws + 7 skipped + 2 months
        assert "alice" in card and "late order events" in card and "Cascade: rebuild downstream" in card
        assert 'notify_finance: <span class="pill pill-act-skip">skip</span>' in card
        assert '<svg class="lineage compact" role="img"' in card
        assert f"<title id=\"ln-req{cascade.pk}-title\">Lineage of dwd_order_items, highlighting request #{cascade.pk}" in card
        assert 'data-node="notify_finance"' in card and "act-skip" in card
        assert card.count('name="decision" value="approve"') == 1
        assert f'hx-post="{decide(ApprovalStep.objects.get(request=cascade, approver__username=owner))}"' in card


def test_requester_auditor_and_unrelated_owner_have_nothing_to_decide(web, cascade):
    for name in ("alice", "audrey", "finn"):
        html = web(name).get(INBOX).content.decode()
        assert f'id="inbox-req-{cascade.pk}"' not in html and "Nothing is waiting for your approval." in html


def test_admin_sees_admin_steps_but_never_for_their_own_requests(web, make_request):
    own = make_request("pending", requester="olivia")  # olivia owns dwd_order_items: the step goes to the admins
    html = web("admin").get(INBOX).content.decode()
    assert f'id="inbox-req-{own.pk}"' in html and "any admin" in html
    assert f'id="inbox-req-{own.pk}"' not in web("olivia").get(INBOX).content.decode()


def test_nav_badge_counts_what_waits_for_me(web, cascade, make_request):
    make_request("pending", start="2022-09-01", end="2022-09-02")
    html = web("olivia").get(reverse("home")).content.decode()
    assert '<span id="nav-inbox-count" class="badge">2<span class="visually-hidden"> waiting</span></span>' in html
    assert 'class="badge badge-zero">0<' in web("alice").get(reverse("home")).content.decode()


def test_owner_approves_with_a_plain_post(web, cascade, olivia):
    step = ApprovalStep.objects.get(request=cascade, approver=olivia)
    client = web("olivia")
    response = client.post(decide(step), {"decision": "approve", "comment": "plan checked"})
    assert response.status_code == 302 and response["Location"] == INBOX
    step.refresh_from_db()
    assert (step.status, step.decided_by, step.comment) == ("approved", olivia, "plan checked")
    row = AuditEvent.objects.get(action="approval_step.approved", object_id=str(step.pk))
    assert row.actor_name == "olivia" and row.reason == "plan checked"
    page = client.get(INBOX).content.decode()
    assert f"You approved the target dataset owner step of request #{cascade.pk}" in page
    assert f'id="inbox-req-{cascade.pk}"' not in page


def test_htmx_approval_returns_the_card_and_the_badge_out_of_band(web, cascade, sam):
    step = ApprovalStep.objects.get(request=cascade, approver=sam)
    response = web("sam").post(decide(step), {"decision": "approve"}, HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    html = response.content.decode()
    assert "<html" not in html and f'id="inbox-req-{cascade.pk}"' in html
    assert 'role="status" tabindex="-1" autofocus>You approved the downstream dataset owner step' in html
    assert "Nothing left for you to decide on this request." in html
    assert '<span id="nav-inbox-count" class="badge badge-zero" hx-swap-oob="true">0' in html


def test_last_approval_approves_the_request(web, cascade, personas):
    for name in ("olivia", "sam", "rita"):
        step = ApprovalStep.objects.get(request=cascade, approver=personas[name])
        assert web(name).post(decide(step), {"decision": "approve"}).status_code == 302
    cascade.refresh_from_db()
    assert cascade.status == "approved"


def test_reject_without_a_comment_is_a_400_shown_on_the_step(web, cascade, olivia):
    step = ApprovalStep.objects.get(request=cascade, approver=olivia)
    for headers in ({}, {"HTTP_HX_REQUEST": "true"}):
        response = web("olivia").post(decide(step), {"decision": "reject", "comment": "  "}, **headers)
        assert response.status_code == 400
        card = inbox_card(response.content.decode(), cascade)
        assert "say why you reject, so the requester can fix it" in card
        assert f'id="step{step.pk}_comment"' in card and 'aria-invalid="true"' in card
    step.refresh_from_db()
    assert step.status == "pending"


def test_reject_with_a_comment_rejects_the_request(web, cascade, olivia):
    step = ApprovalStep.objects.get(request=cascade, approver=olivia)
    response = web("olivia").post(decide(step), {"decision": "reject", "comment": "replay not finished"})
    assert response.status_code == 302
    cascade.refresh_from_db()
    assert cascade.status == "rejected"
    assert set(ApprovalStep.objects.filter(request=cascade).values_list("status", flat=True)) == {
        "rejected", "cancelled"}


@pytest.mark.parametrize("who, reason", [("alice", "nobody approves a step of their own request"),
                                         ("sam", "this step is for olivia, the owner of dwd_order_items"),
                                         ("audrey", "this step is for olivia")])
def test_forged_decision_is_403_recorded_and_changes_nothing(web, cascade, olivia, who, reason):
    step = ApprovalStep.objects.get(request=cascade, approver=olivia)
    for headers in ({}, {"HTTP_HX_REQUEST": "true"}):
        response = web(who).post(decide(step), {"decision": "approve"}, **headers)
        assert response.status_code == 403 and reason in response.content.decode()
    step.refresh_from_db()
    assert step.status == "pending"
    assert AuditEvent.objects.filter(action="denied.approval.approve", actor_name=who).count() == 2


def test_deciding_twice_is_a_409_and_a_missing_decision_a_400(web, cascade, olivia):
    step = ApprovalStep.objects.get(request=cascade, approver=olivia)
    client = web("olivia")
    assert client.post(decide(step), {}).status_code == 400
    assert client.post(decide(step), {"decision": "approve"}).status_code == 302
    response = client.post(decide(step), {"decision": "approve"}, HTTP_HX_REQUEST="true")
    assert response.status_code == 409 and f"step #{step.pk} is already approved" in response.content.decode()


def test_decisions_need_post_login_and_a_csrf_token(web, cascade, olivia, personas):
    step = ApprovalStep.objects.get(request=cascade, approver=olivia)
    assert web("olivia").get(decide(step)).status_code == 405
    anonymous = Client().post(decide(step), {"decision": "approve"})
    assert anonymous.status_code == 302 and anonymous["Location"].startswith(reverse("login"))
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(personas["olivia"])
    assert strict.post(decide(step), {"decision": "approve"}).status_code == 403
    step.refresh_from_db()
    assert step.status == "pending"
    assert web("olivia").post(reverse("approval-step-decide", args=[999999]), {"decision": "approve"}).status_code == 404


# --- hand-offs --------------------------------------------------------------------------------


@pytest.fixture
def handoff(make_request):
    req = make_request("approved", cascade="handoff", start="2022-10-01", end="2022-10-03")
    items = handoffs_open_for(request_id=req.pk)
    return next(i for i in items if i.job.name == "dws_sales_daily")


def test_downstream_owner_sees_the_handoff_and_declining_needs_a_comment(web, handoff):
    client = web("sam")
    html = client.get(INBOX).content.decode()
    assert f'id="inbox-handoff-{handoff.pk}"' in html and "Rebuild dws_sales_daily?" in html
    assert "2022-10-01 → 2022-10-03" in html
    url = reverse("handoff-decide", args=[handoff.pk])
    response = client.post(url, {"decision": "decline"}, HTTP_HX_REQUEST="true")
    assert response.status_code == 400 and "say why the downstream stays" in response.content.decode()
    response = client.post(url, {"decision": "decline", "comment": "dws is recomputed nightly anyway"},
                           HTTP_HX_REQUEST="true")
    assert response.status_code == 200 and "Declined: dws_sales_daily stays on its current version." in \
        response.content.decode()
    handoff.refresh_from_db()
    assert handoff.status == "declined"
    assert AuditEvent.objects.filter(action="handoff.declined", actor_name="sam").exists()


def test_accepting_a_handoff_files_a_linked_cascade_request(web, handoff, sam):
    client = web("sam")
    response = client.post(reverse("handoff-decide", args=[handoff.pk]), {"decision": "accept"})
    assert response.status_code == 302
    handoff.refresh_from_db()
    follow_up = BackfillRequest.objects.get(pk=handoff.follow_up_id)
    assert (follow_up.job.name, follow_up.requested_by, follow_up.status) == ("dws_sales_daily", sam,
                                                                             "pending_approval")
    assert f"Accepted: request #{follow_up.pk}" in client.get(INBOX).content.decode()


def test_someone_elses_handoff_is_refused(web, handoff):
    response = web("olivia").post(reverse("handoff-decide", args=[handoff.pk]), {"decision": "accept"})
    assert response.status_code == 403 and "this hand-off is for sam" in response.content.decode()
    handoff.refresh_from_db()
    assert handoff.status == HandoffItem.Status.PENDING


def test_inbox_forms_are_labelled_and_htmx_swaps_refusals_inline(web, cascade):
    html = web("olivia").get(INBOX).content.decode()
    step = ApprovalStep.objects.get(request=cascade, approver__username="olivia")
    assert f'<label for="step{step.pk}_comment">Comment</label>' in html
    assert 'aria-describedby="step' in html
    assert json.loads(html.split('name="htmx-config" content=\'')[1].split("'>")[0])["responseHandling"]


def test_the_home_lists_the_handoff_and_the_inbox_count_of_its_owner_and_nothing_for_on_call(web, handoff):
    sam = web("sam").get(reverse("home")).content.decode()
    assert "Hand-offs for you" in sam and "Rebuild <strong>dws_sales_daily</strong>" in sam
    assert f"#inbox-handoff-{handoff.pk}" in sam
    assert '<span id="nav-inbox-count" class="badge">1<' in sam
    oscar = web("oscar").get(reverse("home")).content.decode()
    assert "Hand-offs for you" not in oscar and 'id="nav-inbox-count" class="badge badge-zero">0<' in oscar


def test_the_navigation_count_is_the_length_of_what_the_inbox_lists_for_every_persona(
        web, cascade, handoff, make_request, personas):
    """The badge's count is one statement compiled once per process (waiting_count):
    it must stay the length of the two querysets the inbox lists, for an owner with
    steps, one with a hand-off, an admin (the admin steps, never of their own
    requests), nobody's, and once a hand-off's deadline has passed."""
    from datetime import timedelta

    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from backfill_portal.backfills.selectors import handoffs_waiting_for, steps_waiting_for, waiting_count

    make_request("pending", requester="olivia")  # olivia owns the dataset: an admin step
    users = [*personas.values(), get_user_model().objects.get(username="admin")]

    def expected(user):
        return steps_waiting_for(user).count() + handoffs_waiting_for(user).count()

    counts = {u.username: waiting_count(u) for u in users}
    assert counts == {u.username: expected(u) for u in users}
    assert counts["olivia"] >= 1 and counts["sam"] >= 2 and counts["admin"] >= 1 and counts["audrey"] == 0

    HandoffItem.objects.filter(pk=handoff.pk).update(deadline=timezone.now() - timedelta(minutes=1))
    assert waiting_count(personas["sam"]) == counts["sam"] - 1 == expected(personas["sam"])
