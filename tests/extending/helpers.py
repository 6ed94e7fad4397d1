"""Helpers of the worked examples' tests: a small catalog, an approved request."""
from __future__ import annotations

import textwrap

from backfill_portal.backfills.services.requests import (
    backfill_request_create,
    backfill_request_decide,
    backfill_request_submit,
)


def small_catalog(datasets: str, jobs: str) -> str:
    """A catalog of one team per persona's part, one pool, and the given entries."""
    head = textwrap.dedent("""
        version: 1
        teams:
          - {name: core-data}
          - {name: finance}
        pools:
          - {name: warehouse, slots: 4}
    """)
    return head + "datasets:\n" + textwrap.indent(textwrap.dedent(datasets), "  ") + \
        "jobs:\n" + textwrap.indent(textwrap.dedent(jobs), "  ")


def approved_request(personas, job: str, *, day: str = "2022-10-01"):
    """Filed by alice, approved by every step's approver (admins for admin steps)."""
    request, _ = backfill_request_create(actor=personas["alice"], job=job, start=day, end=day, reason="worked example")
    backfill_request_submit(actor=personas["alice"], request_id=request.pk, confirm_overlap=True)
    for step in request.approval_steps.filter(status="pending").select_related("approver"):
        backfill_request_decide(actor=step.approver or personas["admin"], request_id=request.pk, approve=True)
    request.refresh_from_db()
    return request
