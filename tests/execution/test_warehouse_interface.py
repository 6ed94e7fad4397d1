"""The executors and the checks reach the warehouse only through the backend interface
(issue #15): run on a backend that is the interface and nothing more, every built-in
job kind stages, verifies, publishes and reconciles; and no module of theirs names a
warehouse member the interface does not have."""
from __future__ import annotations

import ast
from datetime import date
from pathlib import Path

import pytest

from backfill_portal.backends import get_warehouse, reset_warehouse_cache
from backfill_portal.backfills.choices import RequestStatus
from backfill_portal.backfills.services.requests import (
    backfill_request_create,
    backfill_request_decide,
    backfill_request_submit,
)
from backfill_portal.execution.choices import RunStatus
from backfill_portal.execution.models import CheckResult, Delivery, Run
from backfill_portal.web.demo.sources import load_demo_sources
from tests.conftest import ALSO_ON_ICEBERG
from tests.execution.interface_only import ATTRIBUTES, INTERFACE, PREFIX, InterfaceOnlyWarehouse

ROOT = Path(__file__).resolve().parents[2]
# The executors and checks, and the demo's loader (its sources go through `load_source`,
# so the demo runs on every backend, Iceberg included).
CALLERS = ("backfill_portal/execution/executors", "backfill_portal/execution/checks", "backfill_portal/web/demo",
           "backfill_portal/web/management/commands")


def warehouse_members(path: Path) -> set[tuple[int, str]]:
    """(line, member) of every `<...>warehouse.<member>` in a module."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute):
            value = node.value
            name = value.id if isinstance(value, ast.Name) else value.attr if isinstance(value, ast.Attribute) else ""
            if name in ("warehouse", "wh", "db"):
                found.add((node.lineno, node.attr))
    return found


def test_executors_checks_and_the_demo_loader_name_only_members_of_the_interface():
    offenders = []
    for folder in CALLERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for line, member in sorted(warehouse_members(path)):
                if member not in INTERFACE and member not in ATTRIBUTES:
                    offenders.append(f"{path.relative_to(ROOT)}:{line}: warehouse.{member}")
    assert offenders == []


def test_the_guard_sees_a_member_beyond_the_interface(tmp_path):
    module = tmp_path / "kind.py"
    module.write_text("def run(ctx):\n    with ctx.warehouse.transaction():\n        ctx.warehouse.execute('x')\n")
    assert {m for _, m in warehouse_members(module)} - set(INTERFACE) == {"transaction", "execute"}


def test_the_interface_only_backend_has_no_plain_statements(warehouse_url):
    wh = InterfaceOnlyWarehouse(PREFIX + warehouse_url)
    assert wh.dialect == wh.inner.dialect
    for beyond in ("execute", "executemany", "transaction", "table_exists", "stream", "bulk_insert"):
        assert hasattr(wh.inner, beyond) and not hasattr(wh, beyond), beyond
    assert {"stage_select", "stage_rows", "publish", "query", "ref_sql", "source_sql"} <= set(INTERFACE)


@pytest.fixture
def interface_only(settings, catalog, task_queue, warehouse_url):
    """WAREHOUSE_URL names the real backend's interface-only wrapper, for everything:
    the demo's sources are loaded through it too (`load_source`)."""
    settings.WAREHOUSE_URL = PREFIX + warehouse_url
    reset_warehouse_cache()
    warehouse = get_warehouse()
    assert isinstance(warehouse, InterfaceOnlyWarehouse)
    load_demo_sources(warehouse, first=date(2022, 9, 30), last=date(2022, 10, 2), orders_per_day=150,
                      page_views_per_hour=20)
    yield warehouse
    reset_warehouse_cache()


def run_request(personas, queue, job: str, approver: str, **kwargs) -> Run:
    request, _ = backfill_request_create(actor=personas["alice"], job=job, start="2022-10-01", end="2022-10-01",
                                         reason="every kind through the interface", **kwargs)
    backfill_request_submit(actor=personas["alice"], request_id=request.pk, confirm_overlap=True)
    backfill_request_decide(actor=personas[approver], request_id=request.pk, approve=True)
    queue.drain()
    request.refresh_from_db()
    assert request.status == RequestStatus.RECONCILING, request.status
    return Run.objects.get(request=request)


@ALSO_ON_ICEBERG
@pytest.mark.django_db(transaction=True)
def test_every_built_in_kind_runs_through_the_interface_alone(personas, interface_only, task_queue):
    sql = run_request(personas, task_queue, "dwd_order_items", "olivia")
    python = run_request(personas, task_queue, "dwd_order_items_py", "olivia")
    # Reads the SQL job's pinned version (ref_sql) and checks its measure against it.
    rollup = run_request(personas, task_queue, "dws_sales_daily", "sam")
    effect = run_request(personas, task_queue, "notify_finance", "finn", side_effects=["notify_finance"])
    for run in (sql, python, rollup, effect):
        assert run.status == RunStatus.PUBLISHED, (run.job.name, run.status, run.error)
        assert interface_only.current(run.job.dataset.name, "2022-10-01") == run.run_id
    assert CheckResult.objects.filter(run=rollup, name="measure_vs_source", passed=True).exists()
    rows = {r["order_id"] + r["item_id"]: round(float(r["amount"]), 2)
            for r in interface_only.read_partition("dwd_order_items", "2022-10-01")}
    assert rows == {r["order_id"] + r["item_id"]: round(float(r["amount"]), 2)
                    for r in interface_only.read_partition("dwd_order_items_py", "2022-10-01")} and rows
    assert Delivery.objects.filter(job__name="notify_finance", partition_key="2022-10-01").count() == 1
