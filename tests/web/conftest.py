"""Helpers for the web page tests: logged-in clients and requests in a given state,
made through the same services the pages call."""
from __future__ import annotations

import pytest
from django.test import Client

from backfill_portal.backfills.models import BackfillRequest
from backfill_portal.backfills.services.requests import (
    backfill_request_cancel,
    backfill_request_create,
    backfill_request_decide,
    backfill_request_submit,
    request_start_after_approval,
)

REASON = "late order events from the payment gateway"


@pytest.fixture
def web(personas):
    """web('alice') -> a Django test Client logged in as that persona."""

    def client_for(name: str) -> Client:
        client = Client()
        client.force_login(personas[name])
        return client

    return client_for


@pytest.fixture
def make_request(personas, catalog):
    """make_request(state="draft"|"pending"|"approved"|"running"|"cancelled", ...) -> BackfillRequest.

    Approval does not start the request here (pytest-django never runs on_commit hooks
    in a rolled-back test transaction), so "running" starts it explicitly."""

    def make(state: str = "draft", *, requester: str = "alice", job: str = "dwd_order_items",
             start: str = "2022-10-01", end: str = "2022-10-31", **kwargs) -> BackfillRequest:
        actor = personas[requester]
        req, _ = backfill_request_create(actor=actor, job=job, start=start, end=end, reason=REASON, **kwargs)
        if state == "draft":
            return BackfillRequest.objects.get(pk=req.pk)
        backfill_request_submit(actor=actor, request_id=req.pk, confirm_overlap=True)
        if state == "cancelled":
            backfill_request_cancel(actor=actor, request_id=req.pk, reason="changed my mind")
        elif state in ("approved", "running"):
            for step in req.approval_steps.filter(status="pending").select_related("approver"):
                backfill_request_decide(actor=step.approver or personas["admin"], request_id=req.pk, approve=True)
            if state == "running":
                request_start_after_approval(request_id=req.pk)
        return BackfillRequest.objects.get(pk=req.pk)

    return make


@pytest.fixture
def pipeline(personas, demo_sources, task_queue, warehouse):
    """Source data, the catalog with the reconciliation variants, and the in-process
    queue: requests run to their end with run_request(personas, pipeline, ...)."""
    from tests.reconciliation.helpers import deploy

    deploy()
    return task_queue


@pytest.fixture
def incident(personas, pipeline):
    """A good version of two days, a doubled one over it (every run green), and
    dws_sales_daily rebuilt on the doubled one: (good, bad, dws) requests."""
    from tests.browser.scenarios import doubled_incident

    return doubled_incident(personas, pipeline, good_range=("2022-10-01", "2022-10-02"),
                            bad_range=("2022-10-01", "2022-10-02"), with_consumer=True)
