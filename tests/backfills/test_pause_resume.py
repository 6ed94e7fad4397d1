"""Pause and resume (backfills' lifecycle services): a paused request dispatches nothing
new, resuming dispatches again; the API's refusals are clear; a request that ends
(cancelled, say) is no longer paused."""
from __future__ import annotations

import pytest

from backfill_portal.backfills.choices import IntervalStatus, RequestStatus
from backfill_portal.backfills.models import Interval
from backfill_portal.backfills.services.lifecycle import request_pause, request_resume
from backfill_portal.core.models import AuditEvent
from tests.execution.test_pipeline import approved_request

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def ready(catalog, demo_sources, task_queue, warehouse):
    return task_queue


def test_pause_stops_dispatch_and_resume_continues(personas, ready, warehouse):
    request = approved_request(personas, start="2022-10-01", end="2022-10-04", max_active_intervals=1)
    request_pause(actor=personas["alice"], request_id=request.pk)
    ready.drain()
    assert Interval.objects.filter(request=request, status=IntervalStatus.PUBLISHED).count() == 0
    request_resume(actor=personas["oscar"], request_id=request.pk)
    ready.drain()
    request.refresh_from_db()
    assert request.status == RequestStatus.RECONCILING
    assert AuditEvent.objects.filter(request_id=request.pk, action__in=["request.pause", "request.resume"]).count() == 2


def test_pause_resume_and_retry_through_the_api_with_clear_refusals(personas, ready, warehouse, api):
    request = approved_request(personas, start="2022-10-01", end="2022-10-02", max_active_intervals=1)
    assert api("alice").post(f"/api/requests/{request.pk}/pause/").json()["paused"] is True
    again = api("alice").post(f"/api/requests/{request.pk}/pause/")
    assert again.status_code == 409 and "status" in again.json()["errors"]
    assert again.json()["detail"] == f"request #{request.pk} is already paused; resume it to dispatch again"
    forged = api("audrey").post(f"/api/requests/{request.pk}/resume/")
    assert forged.status_code == 403
    assert AuditEvent.objects.filter(request_id=request.pk, action="denied.request.resume").exists()
    assert api("oscar").post(f"/api/requests/{request.pk}/resume/").json()["paused"] is False
    ready.drain()
    done = api("alice").post(f"/api/requests/{request.pk}/retry_failed/")
    assert done.status_code == 409  # nothing failed


def test_cancelling_a_paused_request_ends_its_pause_in_the_audited_cancel(personas, ready, api):
    request = approved_request(personas, start="2022-10-01", end="2022-10-02", max_active_intervals=1)
    assert api("alice").post(f"/api/requests/{request.pk}/pause/").json()["paused"] is True
    response = api("oscar").post(f"/api/requests/{request.pk}/cancel/", {"reason": "wrong range"}, format="json")
    assert response.status_code == 200, response.json()
    assert (response.json()["status"], response.json()["paused"]) == (RequestStatus.CANCELLED, False)
    request.refresh_from_db()
    assert (request.status, request.paused) == (RequestStatus.CANCELLED, False)
    row = AuditEvent.objects.get(request_id=request.pk, action="request.cancel")
    assert (row.from_state, row.to_state, row.data["was_paused"]) == ("running", "cancelled", True)
    resume = api("oscar").post(f"/api/requests/{request.pk}/resume/")
    assert resume.status_code == 409 and "is cancelled; only a paused running request can be resumed" in resume.json()["detail"]

