"""What an Iceberg reader pays for the portal's safety (issue #18): the same queries, read
the way any pyiceberg reader reads (scan with a row filter, planned from the current
snapshot, into Arrow, answered by DuckDB), on a dataset the Iceberg backend published and
on a plain Iceberg table holding exactly its rows, alternated in one run.

The dataset is reader_cost.py's (benchmarks/_setup.py: `reader_spec`, the same rows by
`reader_rows_sql`, here in DuckDB): PARTITIONS daily partitions of ROWS_PER_PARTITION
orders, partition column `ds`, 3 retained versions per partition, what two backfills
leave behind for rollback: every partition is staged (stage_select, in DuckDB), verified
by its marker and published three times through the backend interface, the third
version current. The plain table `orders_plain`, partitioned alike, is appended
partition by partition with pyiceberg from what the dataset shows readers. Shapes as in
reader_cost.py:

    aggregate      the whole dataset, grouped by status
    time_day       a day's worth by a time column (created_at in [day + 12 h, day + 36 h))
    business_key   one order by its business key
    business_date  ship_date = day
    partition      ds = day

Each shape runs REPEAT times on each side, the order swapped every time, a different day
or order each time (the same for both sides); the figure per shape is the ratio of the
medians, the worst printed last. Answers are checked equal first. Target: <= 1.1.
`python benchmarks/reader_cost.py` with WAREHOUSE_URL=iceberg+sqlite:///x (or
iceberg+postgresql://...) runs this; alone, it uses a scratch SQLite catalog.
"""
from __future__ import annotations

import os
import statistics
import time
from datetime import timedelta

import _setup
import duckdb
from _setup import READER_DAYS as DAYS
from _setup import READER_PARTITIONS as PARTITIONS
from _setup import READER_PLAIN as PLAIN
from _setup import READER_REPEAT as REPEAT
from _setup import READER_ROWS as ROWS
from _setup import READER_VERSIONS as VERSIONS
from _setup import reader_day_start as day_start
from _setup import reader_rows_params, reader_rows_sql, reader_spec
from pyiceberg.expressions import And, EqualTo, GreaterThanOrEqual, LessThan
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import IdentityTransform

from backfill_portal.backends import make_warehouse

SPEC = reader_spec()
COLUMNS = SPEC.column_names

if not os.environ.get("WAREHOUSE_URL", "").startswith("iceberg+"):
    os.environ["WAREHOUSE_URL"] = "iceberg+sqlite:///catalog.db"
url, label = _setup.scratch_warehouse("reader_cost_iceberg")
warehouse = make_warehouse(url)
warehouse.ensure_meta()
t0 = time.perf_counter()
select = reader_rows_sql("duckdb")
for version in range(1, VERSIONS + 1):
    for day in DAYS:
        key = day.isoformat()
        run_id = f"read-{key}-v{version}"
        warehouse.stage_select(spec=SPEC, run_id=run_id, attempt_no=1, partition=key, select_sql=select,
                               params=reader_rows_params(warehouse, day, version))
        expected = f"read-{key}-v{version - 1}" if version > 1 else None
        warehouse.publish(spec_or_name=SPEC, partition=key, run_id=run_id, expected_run_id=expected, actor="bench")
catalog = warehouse.catalog
published = catalog.load_table(f"{warehouse.namespace}.{SPEC.name}")
schema_columns = [f for f in published.schema().fields if f.name in COLUMNS]
plain_schema = Schema(*schema_columns)
plain = catalog.create_table(
    f"{warehouse.namespace}.{PLAIN}", schema=plain_schema,
    partition_spec=PartitionSpec(PartitionField(source_id=plain_schema.find_field("ds").field_id, field_id=1000,
                                                transform=IdentityTransform(), name="ds")))
for day in DAYS:
    part = published.scan(row_filter=EqualTo("ds", day.isoformat()), selected_fields=COLUMNS).to_arrow()
    plain.append(part.select(list(COLUMNS)).cast(plain.schema().as_arrow()))
print(f"{label}: {PARTITIONS} partitions x {ROWS} rows, {VERSIONS} versions each, built in "
      f"{time.perf_counter() - t0:.1f} s")


def instant(day, hours: int) -> str:
    return (day_start(day) + timedelta(hours=hours)).isoformat()


SHAPES = {
    "aggregate": (lambda i: None, "SELECT status, COUNT(*), SUM(amount) FROM t GROUP BY status ORDER BY status"),
    "time_day": (lambda i: And(GreaterThanOrEqual("created_at", instant(DAYS[i % PARTITIONS], 12)),
                               LessThan("created_at", instant(DAYS[i % PARTITIONS], 36))),
                 "SELECT COUNT(*), SUM(amount) FROM t"),
    "business_key": (lambda i: EqualTo("order_id", f"{DAYS[(i * 7) % PARTITIONS]}-{1 + (i * 4099) % ROWS}"),
                     "SELECT order_id, customer_id, status, amount FROM t"),
    "business_date": (lambda i: EqualTo("ship_date", DAYS[(i * 11) % PARTITIONS].isoformat()),
                      "SELECT COUNT(*), SUM(amount) FROM t"),
    "partition": (lambda i: EqualTo("ds", DAYS[(i * 13) % PARTITIONS].isoformat()),
                  "SELECT COUNT(*), SUM(amount) FROM t"),
}


def read(name: str, row_filter, answer: str) -> tuple[float, list]:
    """A reader's whole path: load the table, plan and read the filtered scan, answer."""
    start = time.perf_counter()
    table = catalog.load_table(f"{warehouse.namespace}.{name}")
    scan = table.scan(selected_fields=COLUMNS) if row_filter is None else table.scan(row_filter=row_filter,
                                                                                        selected_fields=COLUMNS)
    t = scan.to_arrow()  # noqa: F841 - DuckDB reads it by name
    rows = duckdb.sql(answer).fetchall()
    return time.perf_counter() - start, rows


def normalised(rows: list) -> list:
    return sorted(tuple(round(v, 2) if isinstance(v, float) else v for v in row) for row in rows)


ratios = {}
for shape, (filter_of, answer) in SHAPES.items():
    for i in range(3):  # warm both, and prove they answer alike
        a, b = read(SPEC.name, filter_of(i), answer)[1], read(PLAIN, filter_of(i), answer)[1]
        assert normalised(a) == normalised(b), (shape, a, b)
    times = {SPEC.name: [], PLAIN: []}
    for i in range(REPEAT):
        for side in ((SPEC.name, PLAIN) if i % 2 == 0 else (PLAIN, SPEC.name)):
            times[side].append(read(side, filter_of(i), answer)[0])
    p, q = statistics.median(times[SPEC.name]), statistics.median(times[PLAIN])
    ratios[shape] = p / q
    print(f"{shape:14s} published {p * 1000:8.2f} ms   plain table {q * 1000:8.2f} ms   ratio {p / q:5.2f}")

worst = max(ratios, key=ratios.get)
print(f"load average {os.getloadavg()[0]:.2f}")
print(f"ratio: {ratios[worst]:.2f} (worst of {len(ratios)} query shapes, {worst}: published Iceberg dataset over a "
      f"plain Iceberg table of the same rows, {label}, pyiceberg scan + DuckDB, {VERSIONS} versions per partition, "
      f"medians of {REPEAT})")
