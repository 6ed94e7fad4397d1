"""What an Iceberg reader pays for the portal's safety (issue #18): the same queries, read
the way any pyiceberg reader reads (scan with a row filter, planned from the current
snapshot, into Arrow, answered by DuckDB), on a dataset the Iceberg backend published and
on a plain Iceberg table holding exactly its rows, alternated in one run.

The dataset `orders_read` (PARTITIONS daily partitions of ROWS_PER_PARTITION orders,
partition column `ds`) has 3 retained versions per partition, what two backfills leave
behind for rollback: every partition is staged (stage_select, in DuckDB), verified by
its marker and published three times through the backend interface, the third version
current. The plain table `orders_plain`, partitioned alike, is appended partition by
partition with pyiceberg from what the dataset shows readers. Shapes as in
reader_cost.py:

    aggregate      the whole dataset, grouped by status
    time_day       one business day by a time column (created_at in [day, day + 1))
    business_key   one order by its business key
    business_date  ship_date = day
    partition      ds = day

Each shape runs REPEAT times on each side, the order swapped every time, a different day
or order each time (the same for both sides); the figure per shape is the ratio of the
medians, the worst printed last. Answers are checked equal first. Target: <= 1.1.
Runs in a temporary directory (SQLite catalog); nothing else is needed.
"""
from __future__ import annotations

import os
import statistics
import tempfile
import time
from datetime import date, datetime, timedelta, timezone

import _setup  # noqa: F401 - puts the project on sys.path
import duckdb
from pyiceberg.expressions import And, EqualTo, GreaterThanOrEqual, LessThan

from backfill_portal.backends import DatasetSpec, make_warehouse

PARTITIONS = int(os.environ.get("PARTITIONS", "30"))
ROWS = int(os.environ.get("ROWS_PER_PARTITION", "10000"))
REPEAT = int(os.environ.get("REPEAT", "15"))
VERSIONS = 3
FIRST_DAY = date(2022, 10, 1)
DAYS = [FIRST_DAY + timedelta(days=i) for i in range(PARTITIONS)]
SPEC = DatasetSpec(
    name="orders_read",
    columns=(("order_id", "text"), ("customer_id", "text"), ("ds", "text"), ("ship_date", "date"),
             ("created_at", "timestamp"), ("status", "text"), ("amount", "numeric")),
    business_key=("order_id",),
    core_measure="amount",
    partition_column="ds",
)
COLUMNS = SPEC.column_names
PLAIN = "orders_plain"


def rows_sql(day: date, version: int) -> str:
    """One partition's rows (version changes the amounts, as a backfill would)."""
    return f"""
        SELECT 'o' || strftime(DATE '{day}', '%Y%m%d') || lpad(CAST(i AS VARCHAR), 6, '0') AS order_id,
               'c' || CAST(i % 997 AS VARCHAR) AS customer_id, '{day}' AS ds,
               DATE '{day}' + CAST(i % 5 AS INTEGER) AS ship_date,
               TIMESTAMPTZ '{day} 00:00:00+00' + to_microseconds(CAST(i AS BIGINT) * 8640000000 // {ROWS})
                 AS created_at,
               ['new', 'paid', 'shipped', 'returned'][1 + i % 4] AS status,
               CAST((i * 37 + {version}) % 10000 AS DOUBLE) / 100 AS amount
        FROM range({ROWS}) AS t(i)"""


tmp = tempfile.mkdtemp(prefix="bench_reader_iceberg_")
warehouse = make_warehouse(f"iceberg+sqlite:///{tmp}/catalog.db?warehouse={tmp}/iceberg")
warehouse.ensure_meta()
t0 = time.perf_counter()
for day in DAYS:
    key, previous = day.isoformat(), None
    for version in range(VERSIONS):
        run_id = f"run-{key}-{version}"
        warehouse.stage_select(spec=SPEC, run_id=run_id, attempt_no=1, partition=key, select_sql=rows_sql(day, version))
        warehouse.publish(spec_or_name=SPEC, partition=key, run_id=run_id, expected_run_id=previous, actor="bench")
        previous = run_id
catalog = warehouse.catalog
published = catalog.load_table(f"{warehouse.namespace}.{SPEC.name}")
schema_columns = [f for f in published.schema().fields if f.name in COLUMNS]
from pyiceberg.partitioning import PartitionField, PartitionSpec  # noqa: E402
from pyiceberg.schema import Schema  # noqa: E402
from pyiceberg.transforms import IdentityTransform  # noqa: E402

plain_schema = Schema(*schema_columns)
plain = catalog.create_table(
    f"{warehouse.namespace}.{PLAIN}", schema=plain_schema,
    partition_spec=PartitionSpec(PartitionField(source_id=plain_schema.find_field("ds").field_id, field_id=1000,
                                                transform=IdentityTransform(), name="ds")))
for day in DAYS:
    part = published.scan(row_filter=EqualTo("ds", day.isoformat()), selected_fields=COLUMNS).to_arrow()
    plain.append(part.select(list(COLUMNS)).cast(plain.schema().as_arrow()))
print(f"built {PARTITIONS} partitions x {ROWS} rows, {VERSIONS} versions each, in {time.perf_counter() - t0:.1f} s")

SHAPES = {
    "aggregate": (lambda i: None, "SELECT status, COUNT(*), SUM(amount) FROM t GROUP BY status ORDER BY status"),
    "time_day": (lambda i: And(GreaterThanOrEqual("created_at", f"{DAYS[i % PARTITIONS]}T00:00:00+00:00"),
                               LessThan("created_at", f"{DAYS[i % PARTITIONS] + timedelta(days=1)}T00:00:00+00:00")),
                 "SELECT COUNT(*), SUM(amount) FROM t"),
    "business_key": (lambda i: EqualTo("order_id", f"o{DAYS[i % PARTITIONS]:%Y%m%d}{(i * 7919) % ROWS:06d}"),
                     "SELECT * FROM t"),
    "business_date": (lambda i: EqualTo("ship_date", DAYS[i % PARTITIONS].isoformat()),
                      "SELECT COUNT(*), SUM(amount) FROM t"),
    "partition": (lambda i: EqualTo("ds", DAYS[i % PARTITIONS].isoformat()), "SELECT COUNT(*), SUM(amount) FROM t"),
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
      f"plain Iceberg table of the same rows, pyiceberg scan + DuckDB, {VERSIONS} versions per partition, "
      f"medians of {REPEAT})")
