"""Shared by the reconciliation and rollback tests: the test catalog with the variants
the incidents need, and a way to run a request to its end."""
from __future__ import annotations

import yaml

from backfill_portal.catalog.services.sync import catalog_sync
from tests.conftest import DEPTH_CATALOG, TEST_CATALOG
from tests.execution.test_pipeline import approved_request

# The 2 a.m. incident's job: the good query's rows appended a second time. The copy
# carries a suffixed item_id (as an append with a surrogate row id would), so keys stay
# unique and verification passes - while every row and every amount is doubled.
DOUBLED_SQL = """SELECT l.order_id, l.item_id || s.suffix AS item_id, l.category, l.amount FROM (
  SELECT order_id, item_id, category, amount FROM (
    SELECT e.*, ROW_NUMBER() OVER (PARTITION BY order_id, item_id ORDER BY updated_at DESC, event_id DESC) AS rn
    FROM {{ ref('ods_order_events') }} AS e WHERE item_id IS NOT NULL
  ) AS latest WHERE rn = 1
) AS l CROSS JOIN (SELECT '' AS suffix UNION ALL SELECT '#appended' AS suffix) AS s
"""


def catalog_text(*, dwd_sql: str | None = None, deep: bool = False) -> str:
    """TEST_CATALOG plus a non-deterministic python job; optionally another SQL for
    dwd_order_items (a code change deployed), and the two layers of DEPTH_CATALOG."""
    doc = yaml.safe_load(TEST_CATALOG)
    if deep:
        extra = yaml.safe_load(DEPTH_CATALOG)
        doc["datasets"] += extra["datasets"]
        doc["jobs"] += extra["jobs"]
    sample = next(d for d in doc["datasets"] if d["name"] == "dwd_order_items_py")
    doc["datasets"].append({**sample, "name": "dwd_order_items_sample"})
    doc["jobs"].append({"name": "dwd_order_items_sample", "produces": "dwd_order_items_sample",
                        "reads": ["ods_order_events"], "kind": "python", "pool": "warehouse",
                        "callable": "tests.execution.jobs.random_sample"})
    if dwd_sql is not None:
        next(j for j in doc["jobs"] if j["name"] == "dwd_order_items")["sql"] = dwd_sql
    return yaml.safe_dump(doc, sort_keys=False)


def deploy(*, dwd_sql: str | None = None, deep: bool = False) -> None:
    catalog_sync(text=catalog_text(dwd_sql=dwd_sql, deep=deep))


def run_request(personas, queue, **kwargs):
    """File, approve and run a request to its end (reconciling, or failed)."""
    request = approved_request(personas, **kwargs)
    queue.drain()
    request.refresh_from_db()
    return request
