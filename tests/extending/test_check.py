"""docs/extending.md, "A verification check": `row_ceiling_check.py` adds a check in one
file; it runs during verification, in its place, and blocks publication when it fails."""
from __future__ import annotations

import pytest

from backfill_portal.execution import checks
from backfill_portal.execution.choices import RunStatus
from backfill_portal.execution.models import CheckResult, Run
from backfill_portal.catalog.services.sync import catalog_sync
from backfill_portal.warehouse.models import Publication
from tests.extending.helpers import approved_request, small_catalog

pytestmark = pytest.mark.django_db(transaction=True)

BUILT_IN = ["row_count_positive", "row_count_baseline", "unique_business_key", "no_null_business_key",
            "declared_schema", "inputs_not_rolled_back"]


def catalog(max_rows: int) -> str:
    return small_catalog(
        f"""
        - name: pages
          owner: olivia
          team: core-data
          timezone: UTC
          grain: day
          business_key: [page]
          tolerances: {{max_rows: {max_rows}}}
          columns:
            - {{name: page, type: text}}
        """,
        """
        - name: pages
          produces: pages
          kind: sql
          pool: warehouse
          sql: "SELECT 'home' AS page UNION ALL SELECT 'about' AS page UNION ALL SELECT 'help' AS page"
        """)


def results(run) -> list[tuple[str, bool, bool]]:
    return [(c.name, c.passed, c.blocking) for c in CheckResult.objects.filter(run=run).order_by("pk")]


def test_a_failing_registered_check_blocks_publication(row_ceiling_check, personas, task_queue, warehouse):
    catalog_sync(text=catalog(max_rows=2))
    request = approved_request(personas, "pages")
    task_queue.drain()
    run = Run.objects.get(request=request)
    assert run.status == RunStatus.VERIFICATION_FAILED
    assert "row_count_ceiling: 3 rows is over the ceiling of 2" in run.error
    names = [name for name, _, _ in results(run)]
    assert names == BUILT_IN[:4] + ["row_count_ceiling"] + BUILT_IN[4:]
    ceiling = CheckResult.objects.get(run=run, name="row_count_ceiling")
    assert (ceiling.passed, ceiling.blocking, ceiling.observed) == (False, True, {"rows": 3, "max_rows": 2})
    assert not Publication.objects.exists()
    assert warehouse.current("pages", "2022-10-01") is None


def test_a_passing_registered_check_lets_the_version_publish(row_ceiling_check, personas, task_queue, warehouse):
    catalog_sync(text=catalog(max_rows=3))
    request = approved_request(personas, "pages")
    task_queue.drain()
    run = Run.objects.get(request=request)
    assert run.status == RunStatus.PUBLISHED
    assert ("row_count_ceiling", True, True) in results(run)
    assert warehouse.current("pages", "2022-10-01") == run.run_id


def test_without_the_module_the_check_does_not_run(personas, task_queue, warehouse):
    assert "row_count_ceiling" not in checks.registry
    catalog_sync(text=catalog(max_rows=2))
    request = approved_request(personas, "pages")
    task_queue.drain()
    run = Run.objects.get(request=request)
    assert run.status == RunStatus.PUBLISHED
    assert [name for name, _, _ in results(run)] == BUILT_IN


def test_the_built_in_checks_run_in_their_documented_order():
    assert [c.name for c in checks.registered_checks()] == BUILT_IN + ["measure_vs_source", "catalog_assertions"]


def test_a_check_that_cannot_use_its_setting_fails_the_run_naming_the_error(row_ceiling_check, personas,
                                                                            task_queue, warehouse):
    """The exploratory test: a check that raised (a tolerance of the wrong kind) sent the
    run back to `staged`, and the sweeper tried again, for ever, with a traceback on the
    run's page. Running it again gives the same answer: it is a failed blocking check."""
    catalog_sync(text=catalog(max_rows=2).replace("{max_rows: 2}", "{max_rows: lots}"))
    request = approved_request(personas, "pages")
    task_queue.drain()
    run = Run.objects.get(request=request)
    assert run.status == RunStatus.VERIFICATION_FAILED, run.status
    assert "row_count_ceiling: the check could not run: TypeError" in run.error
    ceiling = CheckResult.objects.get(run=run, name="row_count_ceiling")
    assert (ceiling.passed, ceiling.blocking) == (False, True)
    assert not Publication.objects.exists()
