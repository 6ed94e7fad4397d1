"""docs/extending.md, "A job kind": `seed_kind.py` adds the kind and its executor in one
file; a job of that kind loads from a catalog and runs through the real run path."""
from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from backfill_portal.backfills.choices import RequestStatus, StepKind
from backfill_portal.backfills.services.requests import (
    backfill_request_create,
    backfill_request_decide,
    backfill_request_submit,
)
from backfill_portal.catalog import kinds
from backfill_portal.catalog.kinds import JobKindBase, register_kind
from backfill_portal.catalog.models import Job
from backfill_portal.catalog.services.sync import CatalogError, catalog_sync
from backfill_portal.execution import executors
from backfill_portal.execution.choices import RunStatus
from backfill_portal.execution.executors import register_executor, registry_problems
from backfill_portal.execution.models import CheckResult, Run
from tests.extending.helpers import approved_request, small_catalog

pytestmark = pytest.mark.django_db(transaction=True)

DATASET = """
- name: category_names
  owner: olivia
  team: core-data
  timezone: Asia/Shanghai
  grain: day
  business_key: [category]
  columns:
    - {name: category, type: text}
    - {name: label, type: text}
"""
JOB = """
- name: category_names
  produces: category_names
  kind: seed
  pool: warehouse
"""
ROWS = """\
  rows:
    - {category: books, label: Books}
    - {category: games, label: Games and toys}
"""
CATEGORIES = small_catalog(DATASET, JOB + ROWS)


def test_a_seed_job_loads_runs_verifies_and_publishes_its_rows(seed_kind, personas, task_queue, warehouse):
    catalog_sync(text=CATEGORIES)
    job = Job.objects.get(name="category_names")
    assert job.kind == "seed" and not job.has_side_effects
    assert job.current_code_version.definition["rows"][1] == {"category": "games", "label": "Games and toys"}
    request = approved_request(personas, "category_names")
    assert [s.kind for s in request.approval_steps.all()] == [StepKind.OWNER]
    task_queue.drain()
    request.refresh_from_db()
    run = Run.objects.get(request=request)
    assert run.status == RunStatus.PUBLISHED
    assert request.status == RequestStatus.RECONCILING
    rows = warehouse.read_partition("category_names", "2022-10-01")
    assert sorted((r["category"], r["label"]) for r in rows) == [("books", "Books"), ("games", "Games and toys")]
    assert CheckResult.objects.filter(run=run, blocking=True, passed=False).count() == 0


def test_the_kind_validates_its_own_fields_at_catalog_load(seed_kind, personas):
    with pytest.raises(CatalogError) as err:
        catalog_sync(text=small_catalog(DATASET, JOB + "  rows: [books]\n"))
    assert err.value.fields == {"jobs[0].rows": ["seed job category_names: rows must be a list of mappings"]}
    with pytest.raises(CatalogError) as err:
        catalog_sync(text=small_catalog(DATASET, JOB + "  reads: [category_names]\n"))
    assert err.value.fields["jobs[0].rows"] == ["seed job category_names has no rows"]
    assert err.value.fields["jobs[0].reads"] == ["seed job category_names reads no inputs"]


def test_without_the_module_the_kind_is_a_validation_error_naming_the_field(personas):
    assert "seed" not in kinds.kind_names() and "seed" not in executors.registry
    with pytest.raises(CatalogError) as err:
        catalog_sync(text=CATEGORIES)
    assert err.value.fields == {"jobs[0].kind": ["'seed' is not one of sql, python, side_effect, dbt"]}
    assert not Job.objects.exists()


def test_a_kind_without_an_executor_fails_the_start_up_check_with_one_line():
    assert registry_problems() == []
    with kinds.registry.scoped():

        @register_kind
        class Orphan(JobKindBase):
            name = "orphan"

        assert registry_problems() == [
            "job kind 'orphan' has no executor registered (backfill_portal.execution.executors)"]
        with pytest.raises(SystemCheckError, match="execution.E001"):
            call_command("check")
    with executors.registry.scoped():
        register_executor("ghost")(lambda ctx: None)
        assert registry_problems() == [
            "executor 'ghost' is registered for a job kind that does not exist (backfill_portal.catalog.kinds)"]
    assert registry_problems() == []


def test_a_kind_cannot_claim_a_common_job_field():
    from django.core.exceptions import ImproperlyConfigured

    with kinds.registry.scoped(), pytest.raises(ImproperlyConfigured, match="claims common job field"):

        @register_kind
        class Clash(JobKindBase):
            name = "clash"
            required = {"pool": "{kind} job {job} needs a pool"}


PINGED = []

PAGES_AND_PING = small_catalog(
    """
    - name: pages
      owner: olivia
      team: core-data
      timezone: UTC
      grain: day
      business_key: [page]
      columns:
        - {name: page, type: text}
    - name: page_ping
      owner: finn
      team: finance
      timezone: UTC
      grain: day
      business_key: [ds]
      columns:
        - {name: ds, type: text}
    """,
    """
    - name: pages
      produces: pages
      kind: sql
      pool: warehouse
      sql: "SELECT 'home' AS page"
    - name: page_ping
      produces: page_ping
      reads: [pages]
      kind: ping
      pool: warehouse
    """)


@pytest.fixture
def ping_kind():
    """A side-effect kind of the test's own: what it says, not its name, makes it one."""
    with kinds.registry.scoped(), executors.registry.scoped():

        @register_kind
        class Ping(JobKindBase):
            name = "ping"
            has_side_effects = True

        @register_executor("ping")
        def execute_ping(ctx):
            PINGED.append(ctx.run.partition_key)
            ctx.record_output_columns(["ds"])
            return ctx.stage_rows([(ctx.run.partition_key,)])

        PINGED.clear()
        yield


@pytest.mark.parametrize("authorised", [False, True])
def test_a_new_side_effect_kind_runs_in_a_cascade_only_when_authorised(ping_kind, personas, task_queue, warehouse,
                                                                      authorised):
    catalog_sync(text=PAGES_AND_PING)
    assert Job.objects.get(name="page_ping").has_side_effects
    request, _ = backfill_request_create(actor=personas["alice"], job="pages", start="2022-10-01", end="2022-10-01",
                                         reason="worked example", cascade="cascade",
                                         side_effects=["page_ping"] if authorised else [])
    assert request.node_actions == {"page_ping": "rebuild" if authorised else "skip"}
    backfill_request_submit(actor=personas["alice"], request_id=request.pk, confirm_overlap=True)
    assert [s.kind for s in request.approval_steps.order_by("pk")] == (
        [StepKind.OWNER, StepKind.SIDE_EFFECT] if authorised else [StepKind.OWNER])
    for step in request.approval_steps.select_related("approver"):
        backfill_request_decide(actor=step.approver, request_id=request.pk, approve=True)
    task_queue.drain()
    assert PINGED == (["2022-10-01"] if authorised else [])
    ping_runs = Run.objects.filter(request=request, job__name="page_ping")
    assert [r.status for r in ping_runs] == ([RunStatus.PUBLISHED] if authorised else [])


def test_a_kind_that_compiles_its_select_elsewhere_reads_the_pinned_upstream(personas, task_queue, warehouse):
    """The shape of a dbt executor: compile a SELECT over `ctx.ref_sql(upstream)` (the
    upstream exactly as this run pinned it) and hand it to `ctx.stage_select`."""
    with kinds.registry.scoped(), executors.registry.scoped():

        @register_kind
        class Compiled(JobKindBase):
            name = "compiled"
            required = {"model": "{kind} job {job} has no model"}

        @register_executor("compiled")
        def execute_compiled(ctx):
            upstream = ctx.definition["reads"][0]
            return ctx.stage_select(f"SELECT UPPER(m.page) AS page FROM {ctx.ref_sql(upstream)} AS m")

        catalog_sync(text=small_catalog(
            """
            - name: pages
              owner: olivia
              team: core-data
              timezone: UTC
              grain: day
              business_key: [page]
              columns:
                - {name: page, type: text}
            - name: pages_loud
              owner: finn
              team: finance
              timezone: UTC
              grain: day
              business_key: [page]
              columns:
                - {name: page, type: text}
            """,
            """
            - name: pages
              produces: pages
              kind: sql
              pool: warehouse
              sql: "SELECT 'home' AS page"
            - name: pages_loud
              produces: pages_loud
              reads: [pages]
              kind: compiled
              model: shout
              pool: warehouse
            """))
        upstream = approved_request(personas, "pages")
        task_queue.drain()
        request = approved_request(personas, "pages_loud")
        task_queue.drain()
        run = Run.objects.get(request=request)
        assert run.status == RunStatus.PUBLISHED, run.error
        assert [r["page"] for r in warehouse.read_partition("pages_loud", "2022-10-01")] == ["HOME"]
        assert run.consumptions.get().version.run.request_id == upstream.pk
