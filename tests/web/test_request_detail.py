"""The request detail page: what each persona is offered, what a forged POST gets, and
the live partial that stops polling once the request is final."""
from __future__ import annotations

import json

import pytest
from django.urls import reverse

from backfill_portal.backfills.choices import IntervalStatus
from backfill_portal.backfills.models import ApprovalStep, BackfillRequest, Interval
from backfill_portal.core.models import AuditEvent
from backfill_portal.execution.models import Run
from backfill_portal.execution.services.dispatch import dispatch_request


def detail(req) -> str:
    return reverse("request-detail", args=[req.pk])


def action(req, verb: str) -> str:
    return reverse(f"request-{verb}", args=[req.pk])


def status_of(req) -> str:
    return BackfillRequest.objects.values_list("status", flat=True).get(pk=req.pk)


def test_detail_shows_header_progress_grid_steps_and_runs(web, make_request):
    req = make_request("running")
    dispatch_request(request_id=req.pk)
    html = web("alice").get(detail(req)).content.decode()
    assert '<span class="pill pill-running">running</span>' in html
    assert "2022-10-01 → 2022-10-31" in html and "Asia/Shanghai" in html and "alice" in html
    assert req.code_version.hash[:12] in html and "late order events" in html
    assert 'class="progress"' in html and "4 queued" in html and "of <strong>31</strong> intervals" in html
    assert html.count('<td class="c s-') == 31
    first = Run.objects.get(request=req, partition_key="2022-10-01")
    assert (f'<td class="c s-queued"><a href="/runs/{first.run_id}/" '
            f'title="dwd_order_items 2022-10-01: queued ({first.run_id})"></a></td>') in html
    assert '<td class="c s-planned" title="dwd_order_items 2022-10-31: planned"></td>' in html
    assert "Target dataset owner" in html and "olivia" in html
    for run in Run.objects.filter(request=req):
        assert f'href="/runs/{run.run_id}/"' in html
    assert 'hx-trigger="every 2s"' in html and f'hx-get="/requests/{req.pk}/live/' in html


def test_requester_cannot_see_approve_and_a_forged_approve_is_403_with_no_change(web, make_request):
    req = make_request("pending")
    client = web("alice")
    html = client.get(detail(req)).content.decode()
    assert action(req, "approve") not in html and action(req, "reject") not in html
    events = AuditEvent.objects.exclude(action__startswith="denied.").count()
    response = client.post(action(req, "approve"), {"comment": "looks fine to me"})
    assert response.status_code == 403
    assert "nobody approves a step of their own request" in response.content.decode()
    assert status_of(req) == "pending_approval"
    assert set(ApprovalStep.objects.filter(request=req).values_list("status", flat=True)) == {"pending"}
    assert AuditEvent.objects.exclude(action__startswith="denied.").count() == events
    assert AuditEvent.objects.filter(action="denied.approval.approve", actor_name="alice").count() == 1


def test_owner_approves_from_the_detail_page(web, make_request, olivia):
    req = make_request("pending")
    client = web("olivia")
    html = client.get(detail(req)).content.decode()
    assert f'action="{action(req, "approve")}"' in html and f'formaction="{action(req, "reject")}"' in html
    response = client.post(action(req, "approve"), {"comment": "checked the gateway fix"})
    assert response.status_code == 302 and response["Location"] == detail(req)
    assert status_of(req) == "approved"
    step = ApprovalStep.objects.get(request=req)
    assert (step.status, step.decided_by, step.comment) == ("approved", olivia, "checked the gateway fix")
    row = AuditEvent.objects.get(action="request.approve", request_id=req.pk)
    assert (row.actor_name, row.from_state, row.to_state) == ("olivia", "pending_approval", "approved")
    page = client.get(response["Location"]).content.decode()
    assert f"You approved request #{req.pk}; it is now approved." in page
    assert action(req, "approve") not in page  # nothing left to decide


def test_reject_without_a_comment_is_refused_with_the_reason_and_a_400(web, make_request):
    req = make_request("pending")
    response = web("olivia").post(action(req, "reject"), {"comment": ""})
    assert response.status_code == 400
    assert "say why you reject" in response.content.decode()
    assert status_of(req) == "pending_approval"


def test_owner_rejects_with_a_comment(web, make_request):
    req = make_request("pending")
    response = web("olivia").post(action(req, "reject"), {"comment": "use the corrected source first"})
    assert response.status_code == 302 and status_of(req) == "rejected"


def test_an_unrelated_owner_is_offered_nothing_and_refused(web, make_request):
    req = make_request("pending")
    client = web("sam")
    html = client.get(detail(req)).content.decode()
    assert 'id="actions-h"' not in html
    assert client.post(action(req, "approve")).status_code == 403
    assert client.post(action(req, "cancel")).status_code == 403
    assert status_of(req) == "pending_approval"


def test_auditor_reads_everything_and_changes_nothing(web, make_request):
    req = make_request("running")
    client = web("audrey")
    html = client.get(detail(req)).content.decode()
    assert 'id="actions-h"' not in html
    for verb in ("cancel", "pause", "approve", "submit"):
        assert client.post(action(req, verb)).status_code in (403, 409), verb
    req.refresh_from_db()
    assert req.status == "running" and not req.paused


def test_requester_submits_a_draft_from_the_detail_page(web, make_request):
    req = make_request("draft")
    client = web("alice")
    assert f'action="{action(req, "submit")}"' in client.get(detail(req)).content.decode()
    assert client.post(action(req, "submit")).status_code == 302
    assert status_of(req) == "pending_approval"


def test_submitting_an_overlapping_draft_asks_for_confirmation_on_the_page(web, make_request):
    make_request("pending", start="2022-10-01", end="2022-10-05")
    draft = make_request("draft", start="2022-10-03", end="2022-10-04")
    client = web("alice")
    response = client.post(action(draft, "submit"))
    assert response.status_code == 409
    html = response.content.decode()
    assert "confirm to submit anyway" in html and 'name="confirm_overlap"' in html
    assert status_of(draft) == "draft"
    assert client.post(action(draft, "submit"), {"confirm_overlap": "on"}).status_code == 302
    assert status_of(draft) == "pending_approval"


def test_submitting_twice_is_a_409_with_the_reason(web, make_request):
    req = make_request("pending")
    response = web("alice").post(action(req, "submit"))
    assert response.status_code == 409 and "only a draft can be submitted" in response.content.decode()


def test_requester_cancels_with_a_reason(web, make_request):
    req = make_request("pending")
    response = web("alice").post(action(req, "cancel"), {"reason": "wrong range"})
    assert response.status_code == 302 and status_of(req) == "cancelled"
    assert AuditEvent.objects.get(action="request.cancel", request_id=req.pk).reason == "wrong range"


@pytest.mark.parametrize("reason", ["", "   "])
def test_cancel_without_a_reason_is_refused_and_the_request_stays(web, make_request, reason):
    req = make_request("pending")
    response = web("alice").post(action(req, "cancel"), {"reason": reason})
    assert response.status_code == 400
    assert "say why you cancel; the requester and auditors will read it" in response.content.decode()
    assert status_of(req) == "pending_approval"
    assert not AuditEvent.objects.filter(action="request.cancel", request_id=req.pk).exists()


def test_a_reason_with_a_terminal_escape_is_a_form_error_on_the_page_and_a_field_error_in_the_api(
        web, make_request, api):
    """Free text is read back in terminals (manage.py, log tails, CSV in a pager): an ESC
    in a reason was stored and replayed as an escape sequence. Line breaks and tabs stay."""
    req = make_request("pending")
    response = web("alice").post(action(req, "cancel"), {"reason": "wrong range \x1b[2J\x1b[H"})
    assert response.status_code == 400
    assert "the control character U+001B is not allowed" in response.content.decode()
    assert status_of(req) == "pending_approval"
    answer = api("alice").post(f"/api/requests/{req.pk}/cancel/", {"reason": "wrong\x07range"}, format="json")
    assert answer.status_code == 400
    assert answer.json()["errors"]["reason"] == [
        "the control character U+0007 is not allowed; text may hold line breaks and tabs"]
    assert not AuditEvent.objects.filter(action="request.cancel", request_id=req.pk).exists()
    kept = "wrong range:\n\tthe 3rd was late"
    assert web("alice").post(action(req, "cancel"), {"reason": kept}).status_code == 302
    assert AuditEvent.objects.get(action="request.cancel", request_id=req.pk).reason == kept.strip()


def test_oncall_pauses_and_resumes_someone_elses_running_request(web, make_request):
    req = make_request("running")
    client = web("oscar")
    html = client.get(detail(req)).content.decode()
    assert f'action="{action(req, "pause")}"' in html and f'action="{action(req, "cancel")}"' in html
    assert action(req, "resume") not in html and action(req, "retry") not in html
    assert client.post(action(req, "pause")).status_code == 302
    req.refresh_from_db()
    assert req.paused
    html = client.get(detail(req)).content.decode()
    assert f'action="{action(req, "resume")}"' in html and 'pill-paused' in html
    assert client.post(action(req, "resume")).status_code == 302
    req.refresh_from_db()
    assert not req.paused
    assert AuditEvent.objects.filter(request_id=req.pk, action__in=["request.pause", "request.resume"],
                                     actor_name="oscar").count() == 2


def test_pausing_a_paused_request_is_a_409_saying_it_is_already_paused(web, make_request):
    req = make_request("running")
    client = web("alice")
    client.post(action(req, "pause"))
    response = client.post(action(req, "pause"))
    html = response.content.decode()
    assert response.status_code == 409 and f"request #{req.pk} is already paused" in html
    assert "only a running request can be paused" not in html
    pending = make_request("pending", start="2022-11-01", end="2022-11-02")
    response = client.post(action(pending, "pause"))
    assert response.status_code == 409
    assert f"request #{pending.pk} is pending_approval; only a running request can be paused" in response.content.decode()


def test_retry_is_offered_only_with_failed_intervals_and_requeues_them(web, make_request):
    from backfill_portal.backfills.transitions import interval_transition

    req = make_request("running")
    dispatch_request(request_id=req.pk)
    client = web("alice")
    assert action(req, "retry") not in client.get(detail(req)).content.decode()
    interval = Interval.objects.get(request=req, position=0)
    interval_transition(interval, to=IntervalStatus.FAILED, reason="test: worker died")
    assert f'action="{action(req, "retry")}"' in client.get(detail(req)).content.decode()
    assert client.post(action(req, "retry")).status_code == 302
    interval.refresh_from_db()
    assert interval.status in (IntervalStatus.QUEUED, IntervalStatus.PLANNED)


def test_actions_need_post(web, make_request):
    req = make_request("running")
    assert web("alice").get(action(req, "pause")).status_code == 405


def test_htmx_action_redirects_with_hx_location(web, make_request):
    req = make_request("running")
    response = web("alice").post(action(req, "pause"), HTTP_HX_REQUEST="true")
    assert response.status_code == 200 and json.loads(response["HX-Location"])["path"] == detail(req)


# --- the live partial ---------------------------------------------------------------------


def test_live_partial_is_200_and_keeps_polling_while_running(web, make_request):
    req = make_request("running")
    response = web("alice").get(reverse("request-live", args=[req.pk]), HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    html = response.content.decode()
    assert "{% comment" not in html and "<html" not in html
    assert 'id="live"' in html and 'hx-trigger="every 2s"' in html and html.count('<td class="c s-') == 31


def test_live_partial_is_286_once_the_request_is_cancelled(web, make_request):
    req = make_request("cancelled")
    response = web("alice").get(reverse("request-live", args=[req.pk]), HTTP_HX_REQUEST="true")
    assert response.status_code == 286
    html = response.content.decode()
    assert "pill-cancelled" in html and "hx-trigger" not in html
    page = web("alice").get(detail(req)).content.decode()
    assert 'hx-trigger="every 2s"' not in page  # a final request is not polled at all


@pytest.mark.parametrize("state", ["rejected", "completed", "failed"])
def test_live_partial_stops_polling_for_every_final_state(web, make_request, state):
    from backfill_portal.backfills.transitions import request_transition

    req = make_request("pending" if state == "rejected" else "running")
    path = {"rejected": ["rejected"], "completed": ["reconciling", "completed"], "failed": ["failed"]}[state]
    for to in path:
        request_transition(req, to=to, actor=None)
    assert web("alice").get(reverse("request-live", args=[req.pk])).status_code == 286


def keys_of(html: str) -> str:
    return html.split('id="req-poll"')[1].split("v=")[1].split('"')[0]


def test_live_update_is_204_until_something_changes_then_sends_only_the_changed_sections(web, make_request):
    req = make_request("pending")
    client = web("alice")
    url = reverse("request-live", args=[req.pk])
    keys = keys_of(client.get(detail(req)).content.decode())
    assert client.get(url, {"v": keys}).status_code == 204
    web("olivia").post(action(req, "approve"), {"comment": "checked"})
    changed = client.get(url, {"v": keys})
    assert changed.status_code == 200
    html = changed.content.decode()
    # The header, the approvals and the actions follow the decision, swapped in place.
    assert '<div class="page-head" id="req-head" hx-swap-oob="true">' in html
    assert html.split('id="req-head"')[1].split("</h1>")[0].count('pill-approved">approved') == 1
    steps = html.split('id="req-steps"')[1].split("</section>")[0]
    assert "pill-approved" in steps and "olivia" in steps and "checked" in steps
    assert 'id="req-actions"' in html
    assert 'id="req-runs"' not in html  # no run yet: that section did not change
    assert "Reload" not in html
    assert client.get(url, {"v": keys_of(html)}).status_code == 204


def test_runs_appear_live_with_the_error_where_a_run_failed(web, make_request):
    req = make_request("running")
    client = web("alice")
    url = reverse("request-live", args=[req.pk])
    keys = keys_of(client.get(detail(req)).content.decode())
    dispatch_request(request_id=req.pk)
    html = client.get(url, {"v": keys}).content.decode()
    runs = html.split('id="req-runs"')[1].split("</section>")[0]
    for run in Run.objects.filter(request=req):
        assert f'href="/runs/{run.run_id}/"' in runs
    assert 'id="req-steps"' not in html and 'id="req-head"' not in html  # neither changed
    run = Run.objects.filter(request=req).order_by("id").first()
    Run.objects.filter(pk=run.pk).update(error="the version has no rows", status="failed")
    html = client.get(url, {"v": keys_of(html)}).content.decode()
    row = html.split(f'data-run="{run.run_id}"')[1].split("</tr>")[0]
    assert "pill-failed" in row and "the version has no rows" in row


def test_a_malformed_key_parameter_gets_every_section(web, make_request):
    req = make_request("pending")
    html = web("alice").get(reverse("request-live", args=[req.pk]), {"v": "x.y<script>"}).content.decode()
    for section in ("req-head", "req-about", "req-actions", "live", "req-impact", "req-related", "req-steps",
                    "req-runs"):
        assert f'id="{section}"' in html, section
    assert "<script>" not in html


def test_retry_says_it_reruns_the_frozen_code_and_offers_a_new_request_with_the_current_code(web, make_request):
    from backfill_portal.backfills.transitions import interval_transition
    from backfill_portal.catalog.models import CodeVersion, Job

    req = make_request("running")
    dispatch_request(request_id=req.pk)
    interval_transition(Interval.objects.get(request=req, position=0), to=IntervalStatus.FAILED, reason="test")
    client = web("alice")
    html = client.get(detail(req)).content.decode()
    note = html.split('data-testid="retry-note">')[1].split("</p>")[0]
    assert "code version frozen at submission" in note and req.code_version.short_hash in note
    assert "changed since" not in note
    assert ("file a new request with the current code" in note
            and "/requests/new/?job=dwd_order_items&amp;start=2022-10-01&amp;end=2022-10-31&amp;cascade=none" in note)
    job = Job.objects.get(name="dwd_order_items")
    newer = CodeVersion.objects.create(job=job, hash="f" * 64, definition=req.code_version.definition)
    Job.objects.filter(pk=job.pk).update(current_code_version=newer)
    note = client.get(detail(req)).content.decode().split('data-testid="retry-note">')[1].split("</p>")[0]
    assert "which has changed since" in note
    form = client.get("/requests/new/?job=dwd_order_items&start=2022-10-01&end=2022-10-31&cascade=none")
    page = form.content.decode()
    assert 'value="2022-10-01"' in page and 'value="2022-10-31"' in page
    assert 'data-testid="interval-count">31</strong>' in page  # the prefilled form previews the same plan


def test_more_than_2000_intervals_show_one_cell_per_local_day(web, make_request):
    req = make_request("pending", job="page_views_hourly", start="2022-10-01T00:00-04:00",
                       end="2023-01-31T23:00-05:00")
    assert req.interval_count > 2000
    html = web("alice").get(detail(req)).content.decode()
    assert "One cell per local day" in html
    assert html.count('<td class="c s-') == 123  # Oct 31 + Nov 30 + Dec 31 + Jan 31 local days
    assert 'title="page_views_hourly 2022-11-06: 25 intervals, 25 planned"' in html


def test_day_cells_take_the_state_that_needs_attention(web, make_request):
    req = make_request("pending", job="page_views_hourly", start="2022-10-01T00:00-04:00",
                       end="2023-01-31T23:00-05:00")
    day = Interval.objects.filter(request=req, partition_key__startswith="2022-10-02").order_by("position")
    Interval.objects.filter(pk__in=[i.pk for i in day[:20]]).update(status="published")
    Interval.objects.filter(pk=day[20].pk).update(status="failed")
    Interval.objects.filter(request=req, partition_key__startswith="2022-10-03").update(status="published")
    Interval.objects.filter(request=req, partition_key__startswith="2022-10-04T0").update(status="published")
    html = web("alice").get(detail(req)).content.decode()

    def cell(state, day, title):
        return (f'<td class="c s-{state}"><a href="/requests/{req.pk}/calendar/?job=page_views_hourly&amp;'
                f'within={day}" title="page_views_hourly {day}: 24 intervals, {title}"></a></td>')

    assert cell("failed", "2022-10-02", "3 planned, 20 published, 1 failed") in html
    assert cell("published", "2022-10-03", "24 published") in html
    assert cell("partial", "2022-10-04", "14 planned, 10 published") in html
    assert cell("planned", "2022-10-05", "24 planned") in html
    # The progress bar is counted from the same GROUP BY as the cells.
    total = req.interval_count
    assert f'aria-label="54 of {total} intervals done; 54 published; 1 failed"' in html
