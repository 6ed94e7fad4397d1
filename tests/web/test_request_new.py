"""The new-request form and its htmx preview."""
from __future__ import annotations

import json

import pytest
from django.test import Client
from django.urls import reverse

from backfill_portal.backfills.models import ApprovalStep, BackfillRequest, Interval
from backfill_portal.core.models import AuditEvent
from tests.web.conftest import REASON

NEW = "/requests/new/"
PREVIEW = "/requests/preview/"
HOURLY_DST_DAY = {"job": "page_views_hourly", "start": "2022-11-06T00:00-04:00", "end": "2022-11-06T23:00-05:00"}


def form_data(**overrides) -> dict:
    data = {"job": "dwd_order_items", "start": "2022-10-01", "end": "2022-10-31", "reason": REASON,
            "cascade": "none", "strategy": "forward", "max_active_intervals": "4", "action": "create"}
    data.update(overrides)
    return {k: v for k, v in data.items() if v is not None}


def test_new_request_page_lists_non_source_jobs_with_grain_and_timezone(web, catalog):
    html = web("alice").get(NEW).content.decode()
    assert "dwd_order_items — daily, Asia/Shanghai" in html
    assert "page_views_hourly — hourly, America/New_York" in html
    assert 'value="ods_order_events"' not in html  # a source is never backfilled
    assert 'name="side_effects" value="notify_finance"' in html
    assert 'hx-post="/requests/preview/"' in html and 'hx-trigger="change, keyup delay:400ms"' in html
    assert 'hx-target="#preview"' in html and 'id="preview"' in html
    assert 'name="confirm_overlap"' not in html  # shown only after an overlap warning


def test_job_in_query_string_preselects_it_and_explains_the_partition_format(web, catalog):
    html = web("alice").get(NEW + "?job=page_views_hourly").content.decode()
    assert '<option value="page_views_hourly" selected>' in html
    assert 'id="id_start_helptext"' in html and "America/New_York with its UTC offset" in html
    assert "or the same instant in UTC with Z" in html  # Z is accepted too (calendar.parse_partition)


def test_form_creates_a_draft_end_to_end(web, catalog, alice):
    client = web("alice")
    response = client.post(NEW, form_data())
    req = BackfillRequest.objects.get()
    assert response.status_code == 302 and response["Location"] == reverse("request-detail", args=[req.pk])
    assert req.status == "draft" and req.requested_by == alice and req.reason == REASON
    assert req.interval_count == 31 and Interval.objects.filter(request=req).count() == 31
    assert AuditEvent.objects.filter(action="request.create", request_id=req.pk).count() == 1
    page = client.get(response["Location"]).content.decode()
    assert f"Draft #{req.pk} saved with 31 intervals." in page


def test_create_and_submit_files_the_request_for_approval(web, catalog):
    response = web("alice").post(NEW, form_data(action="submit", side_effects="notify_finance", verify_twice="on",
                                                 cascade="cascade"))
    req = BackfillRequest.objects.get()
    assert response.status_code == 302
    assert req.status == "pending_approval" and req.verify_twice and req.code_version_id is not None
    assert {"owner", "side_effect"} <= set(ApprovalStep.objects.filter(request=req).values_list("kind", flat=True))


def test_double_post_of_the_same_form_files_one_request(web, catalog):
    client = web("alice")
    data = form_data(idempotency_key="k-123")
    first, second = client.post(NEW, data), client.post(NEW, data)
    assert first.status_code == second.status_code == 302 and first["Location"] == second["Location"]
    assert BackfillRequest.objects.count() == 1


@pytest.mark.parametrize("overrides, field, message", [
    ({"start": "2022-10-31", "end": "2022-10-01"}, "end", "is before first partition"),
    ({"job": "no_such_job"}, "job", "Select a valid choice"),
    ({"reason": ""}, "reason", "This field is required"),
    ({"reason": "   "}, "reason", "This field is required"),
    ({"start": "2022/10/01"}, "start", "expected YYYY-MM-DD"),
    ({"max_active_intervals": "0"}, "max_active_intervals", "greater than or equal to 1"),
    ({"start": "2099-01-01", "end": "2099-01-02"}, "end", "partition 2099-01-01 of dwd_order_items has not ended yet"),
    ({"job": "notify_finance"}, "side_effects", "notify_finance is a side-effect node: authorise it"),
])
def test_bad_form_shows_the_field_error_inline_and_writes_nothing(web, catalog, overrides, field, message):
    events = AuditEvent.objects.count()
    response = web("alice").post(NEW, form_data(**overrides))
    assert response.status_code == 200
    html = response.content.decode()
    assert f'id="id_{field}_error"' in html, html[html.find('<form'):][:3000]
    errors = html.split(f'id="id_{field}_error"')[1].split("</ul>")[0]
    assert message in errors
    assert f'aria-invalid="true"' in html
    assert BackfillRequest.objects.count() == 0 and Interval.objects.count() == 0
    assert AuditEvent.objects.count() == events


def test_bad_form_keeps_what_the_user_typed(web, catalog):
    html = web("alice").post(NEW, form_data(start="2022-10-31", end="2022-10-01")).content.decode()
    assert 'value="2022-10-31"' in html and REASON in html


def test_auditor_cannot_file_a_request_and_gets_a_403_page_with_the_reason(web, catalog):
    response = web("audrey").post(NEW, form_data())
    assert response.status_code == 403
    assert "request.create needs the" in response.content.decode()
    assert BackfillRequest.objects.count() == 0
    assert AuditEvent.objects.filter(action="denied.request.create", actor_name="audrey").count() == 1


def test_overlap_asks_for_confirmation_then_submits_the_same_draft(web, make_request):
    active = make_request("pending", start="2022-10-10", end="2022-10-20")
    client = web("alice")
    data = form_data(action="submit", idempotency_key="form-1")
    response = client.post(NEW, data)
    assert response.status_code == 200
    html = response.content.decode()
    assert 'name="confirm_overlap"' in html and f"#{active.pk}" in html
    draft = BackfillRequest.objects.exclude(pk=active.pk).get()
    assert draft.status == "draft"
    response = client.post(NEW, {**data, "confirm_overlap": "on"})
    assert response.status_code == 302
    assert BackfillRequest.objects.count() == 2  # the same draft, now submitted
    draft.refresh_from_db()
    assert draft.status == "pending_approval" and draft.overlaps == [active.pk]


def test_htmx_post_redirects_with_hx_location(web, catalog):
    response = web("alice").post(NEW, form_data(), HTTP_HX_REQUEST="true")
    req = BackfillRequest.objects.get()
    assert response.status_code == 200
    assert json.loads(response["HX-Location"])["path"] == reverse("request-detail", args=[req.pk])


def test_post_without_csrf_token_is_refused(personas, catalog):
    client = Client(enforce_csrf_checks=True)
    client.force_login(personas["alice"])
    response = client.post(NEW, form_data())
    assert response.status_code == 403
    assert BackfillRequest.objects.count() == 0


def test_post_with_the_csrf_token_from_the_page_is_accepted(personas, catalog):
    client = Client(enforce_csrf_checks=True)
    client.force_login(personas["alice"])
    client.get(NEW)
    token = client.cookies["csrftoken"].value
    assert client.post(NEW, form_data(), HTTP_X_CSRFTOKEN=token).status_code == 302
    assert client.post(PREVIEW, HOURLY_DST_DAY).status_code == 403  # the preview needs it too
    assert client.post(PREVIEW, HOURLY_DST_DAY, HTTP_X_CSRFTOKEN=token).status_code == 200


# --- preview ------------------------------------------------------------------------------


def test_preview_counts_25_hours_and_explains_the_repeated_hour(web, catalog):
    response = web("alice").post(PREVIEW, HOURLY_DST_DAY, HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    html = response.content.decode()
    assert '<strong class="big" data-testid="interval-count">25</strong>' in html
    assert "2022-11-06T04:00Z" in html and "2022-11-07T05:00Z" in html
    assert "2022-11-06T01:00-04:00: repeated local hour 01:00 EDT (first occurrence)" in html
    assert "2022-11-06T01:00-05:00: repeated local hour 01:00 EST (second occurrence)" in html
    assert 'id="id_start_helptext" hx-swap-oob="true"' in html  # the format hint follows the job
    assert "<html" not in html  # a fragment, not a page
    assert BackfillRequest.objects.count() == 0


def test_preview_refuses_an_unknown_cascade_as_the_form_does(web, catalog):
    response = web("alice").post(PREVIEW, {**HOURLY_DST_DAY, "cascade": "zzz"}, HTTP_HX_REQUEST="true")
    html = response.content.decode()
    assert "&#x27;zzz&#x27; is not one of" in html
    assert 'data-testid="interval-count"' not in html


def test_preview_refuses_an_unauthorised_side_effect_target_as_the_form_does(web, catalog):
    data = {"job": "notify_finance", "start": "2022-10-01", "end": "2022-10-02"}
    html = web("alice").post(PREVIEW, data, HTTP_HX_REQUEST="true").content.decode()
    assert "notify_finance is a side-effect node: authorise it" in html
    html = web("alice").post(PREVIEW, {**data, "side_effects": "notify_finance"}, HTTP_HX_REQUEST="true").content.decode()
    assert 'data-testid="interval-count">2<' in html


def test_preview_shows_a_23_hour_day_for_a_daily_job_in_spring(web, catalog):
    html = web("alice").post(PREVIEW, {"job": "page_views_hourly", "start": "2022-03-13T00:00-05:00",
                                       "end": "2022-03-13T23:00-04:00"}).content.decode()
    assert 'data-testid="interval-count">23<' in html and "clocks go forward" in html


def test_preview_shows_planner_errors_inline(web, catalog):
    html = web("alice").post(PREVIEW, {"job": "page_views_hourly", "start": "2022-11-06T01:00",
                                       "end": "2022-11-06T02:00-05:00"}).content.decode()
    assert 'role="alert"' in html and "needs a UTC offset" in html
    html = web("alice").post(PREVIEW, {"job": "dwd_order_items", "start": "2022-10-05",
                                       "end": "2022-10-01"}).content.decode()
    assert "is before first partition" in html


def test_preview_asks_for_the_missing_pieces(web, catalog):
    assert "Choose a job" in web("alice").post(PREVIEW, {}).content.decode()
    html = web("alice").post(PREVIEW, {"job": "dwd_order_items"}).content.decode()
    assert "Enter the first and last partition" in html
    assert "does not exist" in web("alice").post(PREVIEW, {"job": "ods_order_events", "start": "2022-10-01",
                                                            "end": "2022-10-01"}).content.decode()


def test_preview_lists_overlapping_active_requests_and_the_approval_steps(web, make_request):
    active = make_request("pending", start="2022-10-10", end="2022-10-20")
    make_request("cancelled", start="2022-10-10", end="2022-10-20")  # not active: not listed
    make_request("pending", start="2022-11-01", end="2022-11-02")  # active, but no overlap
    html = web("alice").post(PREVIEW, {"job": "dwd_order_items", "start": "2022-10-01", "end": "2022-10-31",
                                       "side_effects": ["notify_finance"]}).content.decode()
    overlaps = html.split("Overlapping active requests")[1].split("<h3>")[0]
    assert f'href="/requests/{active.pk}/"' in overlaps and overlaps.count("<li>") == 1
    steps = html.split('<ol class="steps">')[1].split("</ol>")[0]
    assert "Target dataset owner" in steps and "<strong>olivia</strong>" in steps
    assert "Side-effect authorisation" in steps and "notify_finance" in steps and "<strong>finn</strong>" in steps


def test_preview_says_the_owners_own_request_goes_to_the_admins(web, catalog):
    html = web("olivia").post(PREVIEW, {"job": "dwd_order_items", "start": "2022-10-01",
                                        "end": "2022-10-01"}).content.decode()
    assert "<strong>any admin</strong>" in html and "nobody approves their own request" in html


def test_preview_of_a_large_request_adds_the_admin_size_step(web, catalog, settings):
    settings.BACKFILL_ADMIN_APPROVAL_OVER = 10
    html = web("alice").post(PREVIEW, {"job": "dwd_order_items", "start": "2022-10-01",
                                       "end": "2022-10-31"}).content.decode()
    assert "Size approval (admin)" in html and "31 intervals" in html


def test_preview_says_a_range_that_has_not_ended_cannot_be_filed(web, catalog):
    html = web("alice").post(PREVIEW, {"job": "dwd_order_items", "start": "2099-01-01",
                                       "end": "2099-01-02"}).content.decode()
    assert "partition 2099-01-01 of dwd_order_items has not ended yet: it ends at 2099-01-01 16:00 UTC" in html


def test_preview_refuses_a_range_over_the_limit_cheaply(web, catalog, settings):
    settings.BACKFILL_MAX_INTERVALS = 100
    html = web("alice").post(PREVIEW, {"job": "page_views_hourly", "start": "2020-01-01T00:00-05:00",
                                       "end": "2022-12-31T23:00-05:00"}).content.decode()
    assert "the limit is 100" in html


def test_editing_the_form_after_a_saved_draft_files_a_new_request_on_the_next_press(web, catalog):
    client = web("alice")
    assert client.post(NEW, form_data(idempotency_key="form-2")).status_code == 302
    response = client.post(NEW, form_data(idempotency_key="form-2", reason="a different reason"))
    assert response.status_code == 200
    html = response.content.decode()
    first = BackfillRequest.objects.get()
    assert f"Your earlier attempt filed request #{first.pk} (draft)" in html and 'value="form-2"' not in html
    fresh_key = html.split('name="idempotency_key" value="')[1].split('"')[0]
    response = client.post(NEW, form_data(idempotency_key=fresh_key, reason="a different reason"))
    assert response.status_code == 302 and BackfillRequest.objects.count() == 2


def test_a_damaged_hidden_key_gets_a_fresh_one_and_says_so(web, catalog):
    """The exploratory test: a key the form refuses (100,000 characters) came back as it
    was with no visible error, so every press failed the same way."""
    client = web("alice")
    response = client.post(NEW, form_data(idempotency_key="k" * 100_000))
    assert response.status_code == 200
    html = response.content.decode()
    assert "hidden key was not one the portal makes" in html and "k" * 200 not in html
    fresh_key = html.split('name="idempotency_key" value="')[1].split('"')[0]
    assert client.post(NEW, form_data(idempotency_key=fresh_key)).status_code == 302
    assert BackfillRequest.objects.count() == 1


def test_csrf_refusal_page_explains_that_nothing_changed(personas, catalog):
    client = Client(enforce_csrf_checks=True)
    client.force_login(personas["alice"])
    response = client.post(NEW, form_data())
    assert response.status_code == 403 and b"could not be verified" in response.content


def test_web_error_statuses_come_from_the_application_error():
    from backfill_portal.core import errors
    from backfill_portal.core.web import error_status

    classes = (errors.ValidationError, errors.PermissionDenied, errors.NotFound, errors.ConflictError,
               errors.ApplicationError)
    assert [error_status(cls("x")) for cls in classes] == [400, 403, 404, 409, 400]


def test_double_press_of_create_and_submit_submits_once(web, catalog):
    client = web("alice")
    data = form_data(action="submit", idempotency_key="form-3")
    first, second = client.post(NEW, data), client.post(NEW, data)
    assert first.status_code == second.status_code == 302 and first["Location"] == second["Location"]
    req = BackfillRequest.objects.get()
    assert req.status == "pending_approval"
    assert AuditEvent.objects.filter(action="request.submit", request_id=req.pk).count() == 1
    assert f"Request #{req.pk} was already submitted" in client.get(second["Location"]).content.decode()


def test_cascade_preview_lists_downstream_nodes_and_their_owners_steps(web, catalog):
    html = web("alice").post(PREVIEW, {"job": "dwd_order_items", "start": "2022-10-01", "end": "2022-10-03",
                                       "cascade": "cascade"}).content.decode()
    downstream = html.split("<h3>Downstream</h3>")[1].split("<h3>")[0]
    assert "dws_sales_daily: <strong>rebuild</strong>" in downstream
    assert "notify_finance: <strong>skip</strong>" in downstream  # not authorised
    steps = html.split('<ol class="steps">')[1].split("</ol>")[0]
    assert "Downstream dataset owner" in steps and "<strong>sam</strong>" in steps


def test_cascade_request_from_the_form_gets_the_steps_the_preview_promised(web, catalog):
    preview = web("alice").post(PREVIEW, form_data(cascade="cascade", end="2022-10-03")).content.decode()
    promised = preview.split('<ol class="steps">')[1].split("</ol>")[0].count("<li>")
    assert web("alice").post(NEW, form_data(cascade="cascade", end="2022-10-03", action="submit")).status_code == 302
    req = BackfillRequest.objects.get()
    assert req.status == "pending_approval"
    assert ApprovalStep.objects.filter(request=req).count() == promised
    html = web("alice").get(reverse("request-detail", args=[req.pk])).content.decode()
    assert "Downstream plan" in html and 'title="dws_sales_daily 2022-10-01: planned"' in html


def test_submitted_message_counts_the_whole_plan_with_cascaded_jobs(web, catalog):
    client = web("alice")
    response = client.post(NEW, form_data(action="submit", cascade="cascade", start="2022-10-01", end="2022-10-07"))
    req = BackfillRequest.objects.get()
    planned = Interval.objects.filter(request=req).count()
    assert req.interval_count == 7 and planned > 7  # the downstream jobs' intervals are in the plan too
    page = client.get(response["Location"]).content.decode()
    assert f"Request #{req.pk} submitted for approval ({planned} intervals" in page


def test_a_forged_action_is_refused_with_a_form_error_and_saves_nothing(web, catalog):
    response = web("alice").post(NEW, form_data(action="publish-now"))
    assert response.status_code == 200
    html = response.content.decode()
    assert "Unknown action publish-now" in html and 'role="alert"' in html
    assert not BackfillRequest.objects.exists()
    assert not AuditEvent.objects.filter(action="request.create").exists()


def test_no_action_at_all_still_saves_a_draft(web, catalog):
    response = web("alice").post(NEW, form_data(action=None))
    assert response.status_code == 302
    assert BackfillRequest.objects.get().status == "draft"
