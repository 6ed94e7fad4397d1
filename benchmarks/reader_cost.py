"""What readers pay for the portal's safety (issue #15): the same queries on a published
dataset and on a plain table holding exactly its rows, with the same indexes, in one
run, alternated.

The dataset `orders_read` (PARTITIONS daily partitions of ROWS_PER_PARTITION orders;
partition column `ds`; indexes declared on `order_id`, `created_at` and `ship_date`)
has 3 retained versions per partition, what two backfills leave behind for rollback:
every partition is staged, verified by its marker and published three times through
the backend interface, the third version current. The plain table `orders_plain` is
created from what the dataset shows readers, with the declared indexes and one on the
partition column (as any table rewritten partition by partition has), and both are
analysed. Five query shapes:

    aggregate      the whole dataset, grouped by status
    time_day       one business day by a time column (created_at in [day, day + 1))
    business_key   one order by its business key
    business_date  a business-date column a plain table would index (ship_date = day)
    partition      the partition column (ds = day)

Each shape runs REPEAT times on each side, the order swapped every time, a different
day or order each time (the same for both sides); the figure per shape is the ratio of
the medians, and the worst of the five is printed last. Before timing, every shape's
answer is checked to be the same on both sides. Target: ratio <= 1.1 on PostgreSQL and
on SQLite.

The published side uses only the backend interface (ensure_dataset, stage_select,
marker, publish, query). The plain twin is built with a SQL backend's plain statements
(`execute`), as backfill_overhead.py builds its direct table. Runs against a scratch
warehouse: a PostgreSQL database beside WAREHOUSE_URL's when that names PostgreSQL
(`WAREHOUSE_URL=postgresql://... python benchmarks/reader_cost.py`), else a temporary
SQLite file. No metadata database is needed. When WAREHOUSE_URL names an Iceberg catalog
(`iceberg+sqlite:///x` or `iceberg+postgresql://...`), the same dataset is built on the
Iceberg backend in a scratch catalog of that kind and read as any Iceberg reader reads
it (reader_cost_iceberg.py). The dataset and its rows are benchmarks/_setup.py's
(`reader_spec`, `reader_rows_sql`), shared by both.
"""
from __future__ import annotations

import os
import dataclasses
import runpy
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

from _setup import READER_DAYS as DAYS
from _setup import READER_PARTITIONS as PARTITIONS
from _setup import READER_PLAIN as PLAIN
from _setup import READER_REPEAT as REPEAT
from _setup import READER_ROWS as ROWS
from _setup import READER_VERSIONS as VERSIONS
from _setup import reader_day_start as day_start
from _setup import reader_rows_params, reader_rows_sql, reader_spec, scratch_warehouse

if os.environ.get("WAREHOUSE_URL", "").startswith("iceberg+"):
    # The same dataset on the Iceberg backend, read the way Iceberg readers read it.
    runpy.run_path(str(Path(__file__).with_name("reader_cost_iceberg.py")), run_name="__main__")
    sys.exit(0)

from backfill_portal.backends import make_warehouse  # noqa: E402

# READER_LAYOUT (PostgreSQL): "partitioned" or "table" (backends.READER_LAYOUTS); unset:
# the warehouse's default, partitioned.
SPEC = dataclasses.replace(reader_spec(), reader_layout=os.environ.get("READER_LAYOUT", ""))
COLUMNS = ", ".join(f'"{name}"' for name in SPEC.column_names)

url, label = scratch_warehouse("reader_cost")
if SPEC.reader_layout:
    label += f" ({SPEC.reader_layout} layout)"
warehouse = make_warehouse(url)
warehouse.ensure_meta()
warehouse.ensure_dataset(SPEC)


def date_param(day):
    """A date as this engine's parameter: SQLite keeps dates as ISO text."""
    return day if warehouse.dialect == "postgresql" else day.isoformat()


def build() -> None:
    """Three versions per partition, each published over the one before."""
    select = reader_rows_sql(warehouse.dialect)
    for version in range(1, VERSIONS + 1):
        for day in DAYS:
            key = day.isoformat()
            run_id = f"read-{key}-v{version}"
            warehouse.stage_select(spec=SPEC, run_id=run_id, attempt_no=1, partition=key, select_sql=select,
                                   params=reader_rows_params(warehouse, day, version))
            expected = f"read-{key}-v{version - 1}" if version > 1 else None
            warehouse.publish(spec_or_name=SPEC, partition=key, run_id=run_id, expected_run_id=expected,
                              actor="benchmark")
    warehouse.execute(f'CREATE TABLE "{PLAIN}" AS SELECT {COLUMNS} FROM "{SPEC.name}"')
    for index in (*SPEC.indexes, (SPEC.partition_key_column,)):
        warehouse.execute(f'CREATE INDEX "{PLAIN}_{"_".join(index)}" ON "{PLAIN}" ({", ".join(index)})')
    warehouse.execute("VACUUM ANALYZE" if warehouse.dialect == "postgresql" else "ANALYZE")


t0 = time.perf_counter()
build()
staged = warehouse.query(f'SELECT COUNT(*) FROM "{PLAIN}"')[0][0]
print(f"{label} warehouse: {PARTITIONS} partitions x {ROWS} rows, {VERSIONS} versions each "
      f"({PARTITIONS * ROWS * VERSIONS} rows staged, {staged} published) built in {time.perf_counter() - t0:.1f}s")

SHAPES = {
    "aggregate": ("SELECT status, COUNT(*), SUM(amount) FROM {t} GROUP BY status ORDER BY status",
                  lambda i: ()),
    "time_day": ("SELECT COUNT(*), SUM(amount) FROM {t} WHERE created_at >= ? AND created_at < ?",
                 lambda i: (warehouse.ts(day_start(DAYS[i % PARTITIONS]) + timedelta(hours=12)),
                            warehouse.ts(day_start(DAYS[i % PARTITIONS]) + timedelta(hours=36)))),
    "business_key": ("SELECT order_id, customer_id, status, amount FROM {t} WHERE order_id = ?",
                     lambda i: (f"{DAYS[(i * 7) % PARTITIONS].isoformat()}-{1 + (i * 4099) % ROWS}",)),
    "business_date": ("SELECT COUNT(*), SUM(amount) FROM {t} WHERE ship_date = ?",
                      lambda i: (date_param(DAYS[(i * 11) % PARTITIONS]),)),
    "partition": ("SELECT COUNT(*), SUM(amount) FROM {t} WHERE ds = ?",
                  lambda i: (DAYS[(i * 13) % PARTITIONS].isoformat(),)),
}


def run(statement: str, params: tuple) -> tuple[float, list]:
    t = time.perf_counter()
    rows = warehouse.query(statement, params)
    return time.perf_counter() - t, rows


def normalised(rows: list) -> list:
    """Answers compared across engines' number types: sums rounded to the cent."""
    return [tuple(round(float(v), 2) if isinstance(v, (float, int)) or type(v).__name__ == "Decimal" else v
                  for v in row) for row in rows]


ratios = {}
for shape, (template, params_of) in SHAPES.items():
    published, plain = template.format(t=f'"{SPEC.name}"'), template.format(t=f'"{PLAIN}"')
    for i in range(3):  # warm both, and prove they answer alike
        a, b = run(published, params_of(i))[1], run(plain, params_of(i))[1]
        assert normalised(a) == normalised(b), (shape, a, b)
    times = {"published": [], "plain": []}
    for i in range(REPEAT):
        order = ("published", "plain") if i % 2 == 0 else ("plain", "published")
        for side in order:
            times[side].append(run(published if side == "published" else plain, params_of(i))[0])
    p, q = statistics.median(times["published"]), statistics.median(times["plain"])
    ratios[shape] = p / q
    print(f"{shape:14s} published {p * 1000:8.2f} ms   plain table {q * 1000:8.2f} ms   ratio {p / q:5.2f}")

worst = max(ratios, key=ratios.get)
print(f"ratio: {ratios[worst]:.2f} (worst of {len(ratios)} query shapes, {worst}: published dataset over a plain "
      f"table of the same rows and indexes, {label}, {VERSIONS} versions per partition, medians of {REPEAT})")
