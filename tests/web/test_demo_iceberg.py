"""The demo on an Iceberg warehouse (issue #18): `load_demo` loads its sources as
Iceberg tables through the source seam (`load_source`), a backfill of the demo's
catalog runs, verifies and publishes on DuckDB over them, and a separate process reading
the table with pyiceberg alone (no portal code) sees exactly the version the portal
reports; the source is a plain Iceberg table for it too. On a local warehouse and on one
in a bucket of an S3 API server."""
from __future__ import annotations

import json
import subprocess
import sys
from datetime import date

import pytest
from django.core.management import call_command

from backfill_portal.backends.iceberg import IcebergWarehouse
from backfill_portal.execution.choices import RunStatus
from backfill_portal.execution.models import Run
from backfill_portal.warehouse.models import Version
from backfill_portal.web.demo.sources import ORDER_EVENTS, days_missing
from tests.execution.test_pipeline import approved_request

pytestmark = pytest.mark.django_db(transaction=True)

READER = r"""
import json, sys
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.expressions import EqualTo

uri, warehouse, namespace, partition, properties = sys.argv[1:6]
catalog = SqlCatalog("backfill", uri=uri, warehouse=warehouse, **json.loads(properties))
items = catalog.load_table(f"{namespace}.dwd_order_items").scan(row_filter=EqualTo("_partition", partition)).to_arrow()
events = catalog.load_table(f"{namespace}.ods_order_events").scan().to_arrow()
rows = items.to_pylist()
print(json.dumps({
    "rows": len(rows),
    "keys": len({(r["order_id"], r["item_id"]) for r in rows}),
    "amount": round(sum(r["amount"] for r in rows), 2),
    "run_ids": sorted({r["_run_id"] for r in rows}),
    "source_rows": events.num_rows,
}))
"""


@pytest.mark.parametrize("warehouse_url", ["iceberg", "iceberg-s3"], indirect=True)
def test_the_demo_loads_runs_and_publishes_on_iceberg_and_pyiceberg_reads_it_back(personas, task_queue, warehouse):
    assert isinstance(warehouse, IcebergWarehouse)
    call_command("load_demo", first="2022-09-30", last="2022-10-02", orders_per_day=120, page_views_per_hour=6,
                 no_story=True, stdout=open("/dev/null", "w"))
    assert days_missing(warehouse, first=date(2022, 9, 30), last=date(2022, 10, 2)) == 0
    loads = warehouse.source_loads(ORDER_EVENTS)
    assert {"2022-09-30", "2022-10-01", "2022-10-02"} <= set(loads)
    # A second load_demo adds nothing (each day is a keyed load).
    call_command("load_demo", first="2022-09-30", last="2022-10-02", orders_per_day=120, page_views_per_hour=6,
                 no_story=True, stdout=open("/dev/null", "w"))
    assert warehouse.source_loads(ORDER_EVENTS) == loads

    request = approved_request(personas, job="dwd_order_items", start="2022-10-01", end="2022-10-01")
    task_queue.drain()
    run = Run.objects.get(request=request)
    assert run.status == RunStatus.PUBLISHED, run.error
    version = Version.objects.get(run=run)
    assert warehouse.current("dwd_order_items", "2022-10-01") == run.run_id
    published = warehouse.read_partition("dwd_order_items", "2022-10-01")
    assert len(published) == version.row_count > 0

    out = subprocess.run(
        [sys.executable, "-c", READER, warehouse.catalog_uri, warehouse.warehouse_uri,
         warehouse.namespace, "2022-10-01", json.dumps(warehouse.io_properties)],
        capture_output=True, text=True, timeout=120, check=True)
    seen = json.loads(out.stdout)
    assert seen["run_ids"] == [run.run_id]
    assert seen["rows"] == seen["keys"] == version.row_count
    assert seen["amount"] == pytest.approx(round(sum(r["amount"] for r in published), 2))
    assert seen["amount"] == pytest.approx(warehouse.marker(run.run_id).measure_sum, abs=0.01)
    assert seen["source_rows"] == sum(loads.values()) > 0
