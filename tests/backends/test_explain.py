"""`explain`: the warehouse's own estimate of a SELECT, without running it (what the
approval page shows an owner), on SQLite and PostgreSQL. PostgreSQL's planner gives the
rows and cost of the statement; SQLite's query plan has no row estimate and says so;
a statement the planner refuses is an estimate with the refusal, never an exception."""
from __future__ import annotations

import pytest

from backfill_portal.backends import Estimate
from tests.backends.test_contract import (  # noqa: F401 - fixtures
    ORDERS,
    SQL_CONTRACT,
    order_rows,
    publish,
    stage,
    warehouse_url,
    wh,
)


@pytest.fixture(params=SQL_CONTRACT)
def backend_url(request, tmp_path):
    """SQLite and PostgreSQL; the Iceberg backend keeps the base's 'no estimate' for now
    (and its engine does not resolve a dataset's name to its published files yet)."""
    return warehouse_url(request, tmp_path)


def test_explain_gives_the_planners_estimate_of_a_published_dataset_without_reading_it(wh):
    stage(wh, "run-1", order_rows(1000))
    publish(wh, "run-1", None)
    if wh.dialect == "postgresql":
        wh.execute("ANALYZE")  # the planner's row figure comes from the statistics

    estimate = wh.explain(f"SELECT customer, SUM(amount) FROM {ORDERS.name} WHERE paid GROUP BY customer")

    assert isinstance(estimate, Estimate) and not estimate.error
    assert estimate.plan and any(ORDERS.name in line for line in estimate.plan)
    if wh.dialect == "postgresql":
        assert estimate.engine == "PostgreSQL" and estimate.note == ""
        assert 1 <= estimate.rows <= 50  # one row per customer: 50 in order_rows
        assert estimate.cost > 0
        assert any("Scan" in line for line in estimate.plan)
    else:
        assert estimate.engine == "SQLite"
        assert estimate.rows is None and estimate.cost is None
        assert "no row or cost estimate" in estimate.note


def test_a_plain_scan_is_estimated_at_the_rows_the_table_holds_on_postgresql_only(wh):
    stage(wh, "run-1", order_rows(1000))
    publish(wh, "run-1", None)
    if wh.dialect == "postgresql":
        wh.execute("ANALYZE")

    rows = wh.explain(f"SELECT * FROM {ORDERS.name}").rows

    assert rows is None if wh.dialect == "sqlite" else 900 <= rows <= 1100


def test_a_statement_the_planner_refuses_is_an_estimate_with_the_refusal_and_the_warehouse_goes_on(wh):
    stage(wh, "run-1", order_rows(10))
    publish(wh, "run-1", None)

    estimate = wh.explain("SELECT nothing_here FROM no_such_table")

    assert estimate.error and "no_such_table" in estimate.error and "\n" not in estimate.error
    assert estimate.rows is None and estimate.plan == ()
    assert estimate.engine == {"sqlite": "SQLite", "postgresql": "PostgreSQL"}[wh.dialect]
    assert wh.query(f"SELECT COUNT(*) FROM {ORDERS.name}") == [(10,)]


def test_a_long_plan_keeps_its_first_forty_lines(wh):
    stage(wh, "run-1", order_rows(10))
    publish(wh, "run-1", None)
    union = " UNION ALL ".join(f"SELECT order_id FROM {ORDERS.name} WHERE line_no = {i}" for i in range(60))

    estimate = wh.explain(union)

    assert not estimate.error and len(estimate.plan) == 40
