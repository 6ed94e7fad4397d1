"""docs/extending.md, "A job kind": `seed_kind.py` adds the kind and its executor in one
file; a job of that kind loads from a catalog and runs through the real run path."""
from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from backfill_portal.backfills.choices import RequestStatus, StepKind
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
    assert err.value.fields == {"jobs[0].kind": ["'seed' is not one of sql, python, side_effect"]}
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
