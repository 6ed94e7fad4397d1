"""docs/extending.md, "An approval rule": `finance_rule.py` adds a rule in one file; a
request on a finance dataset gets an admin step besides its owner's, and stays pending
until an admin approves."""
from __future__ import annotations

import pytest

from backfill_portal.backfills import approval_rules
from backfill_portal.backfills.choices import RequestStatus, StepKind
from backfill_portal.backfills.services.requests import (
    approval_plan,
    backfill_request_create,
    backfill_request_decide,
    backfill_request_submit,
)
from backfill_portal.catalog import kinds
from backfill_portal.catalog.kinds import JobKindBase, register_kind
from backfill_portal.catalog.models import Job
from backfill_portal.catalog.services.sync import catalog_sync
from backfill_portal.core.errors import ConflictError
from tests.extending.helpers import small_catalog

pytestmark = pytest.mark.django_db

LEDGER = small_catalog(
    """
    - name: ledger
      owner: finn
      team: finance
      timezone: UTC
      grain: day
      business_key: [account]
      columns:
        - {name: account, type: text}
    - name: pages
      owner: olivia
      team: core-data
      timezone: UTC
      grain: day
      business_key: [page]
      columns:
        - {name: page, type: text}
    """,
    """
    - name: ledger
      produces: ledger
      kind: sql
      pool: warehouse
      sql: "SELECT 'cash' AS account"
    - name: pages
      produces: pages
      kind: sql
      pool: warehouse
      sql: "SELECT 'home' AS page"
    """)


def submitted(personas, job: str):
    request, _ = backfill_request_create(actor=personas["alice"], job=job, start="2022-10-01", end="2022-10-01",
                                         reason="worked example")
    backfill_request_submit(actor=personas["alice"], request_id=request.pk)
    return request


def test_a_registered_rule_adds_its_step_and_the_request_waits_for_it(finance_rule, personas):
    catalog_sync(text=LEDGER)
    request = submitted(personas, "ledger")
    assert [(s.kind, s.approver) for s in request.approval_steps.order_by("pk")] == [
        (StepKind.OWNER, personas["finn"]), (StepKind.ADMIN, None)]
    backfill_request_decide(actor=personas["finn"], request_id=request.pk, approve=True)
    request.refresh_from_db()
    assert request.status == RequestStatus.PENDING_APPROVAL
    backfill_request_decide(actor=personas["admin"], request_id=request.pk, approve=True)
    request.refresh_from_db()
    assert request.status in (RequestStatus.APPROVED, RequestStatus.RUNNING)
    # Another team's dataset is not concerned.
    assert [s.kind for s in submitted(personas, "pages").approval_steps.all()] == [StepKind.OWNER]


def test_without_the_module_only_the_built_in_rules_run(personas):
    assert [r.name for r in approval_rules.rules()] == [
        "dataset_owner", "cascade_owners", "side_effect_owners", "admin_over_size"]
    catalog_sync(text=LEDGER)
    assert [s.kind for s in submitted(personas, "ledger").approval_steps.all()] == [StepKind.OWNER]


def test_a_rebuilt_node_of_any_kind_without_side_effects_gets_its_owners_step(personas):
    catalog_sync(text=LEDGER)
    ledger, pages = Job.objects.select_related("dataset__owner").order_by("name")
    with kinds.registry.scoped():

        @register_kind
        class Report(JobKindBase):
            name = "report"

        pages.kind = "report"
        steps = approval_plan(requester_id=personas["alice"].pk, job=ledger, rebuilt=[pages], side_effects=[],
                              interval_count=1)
        assert [(s.kind, s.job, s.approver) for s in steps] == [
            (StepKind.OWNER, ledger, personas["finn"]), (StepKind.DOWNSTREAM, pages, personas["olivia"])]
    # A kind nobody registered is refused, never planned without its owner.
    with pytest.raises(ConflictError, match="'report', which no registered job kind provides"):
        approval_plan(requester_id=personas["alice"].pk, job=ledger, rebuilt=[pages], side_effects=[],
                      interval_count=1)
