"""One 1,000,000-row daily interval through the portal versus the bare `INSERT ...
SELECT` of the same rows (issue #15), in one run, alternated.

The portal side is a one-interval backfill of `bench_daily` (a SQL job over the source
`bench_events`), filed, approved and run task by task in this process through Celery's
`apply`, as backfill_overhead.py runs its in-process comparison: pinning the inputs
(and the source's watermark), staging the version with its commit marker (rows, keys,
NULL keys, the measure and the fingerprint), the verification checks, the
compare-and-set publish and their audit rows. It is timed from filing the request
until the version is published; the reconciliation that follows is run, untimed.
Each round publishes over the one before, so the versions accumulate as two backfills
leave them.

The bare side renders the same SELECT for the same interval and inserts it into a
plain table of the same columns (emptied, untimed, before each round): what a
"dangerous button" costs. On PostgreSQL a checkpoint is taken before each timed phase,
so that neither side pays for the other's page writes.

Prints where the portal's time goes (per task; per warehouse statement: the staging
INSERT, the source's watermark, the rest), the median of ROUNDS rounds per side, and last the ratio.
Targets: ratio <= 1.25 on PostgreSQL, <= 1.3 on SQLite. Scale with ROWS (default
1,000,000). PostgreSQL: DATABASE_URL and WAREHOUSE_URL name PostgreSQL; scratch
databases are made beside both (benchmarks/_setup.py).

Iceberg (WAREHOUSE_URL=iceberg+sqlite:///x or iceberg+postgresql://..., a scratch catalog
of that kind): the source is a plain Iceberg table (DuckDB makes the rows, pyiceberg
appends them); the portal stages in DuckDB over the source's files; the bare side runs
the same SELECT in DuckDB into Arrow and appends it with pyiceberg to a plain Iceberg
table emptied before each round (data file and commit: what writing a partition
directly costs on a lakehouse). No per-statement breakdown there (no statement hook).
"""
from __future__ import annotations

import os
import statistics
import time
import warnings
from collections import deque
from datetime import datetime, timedelta, timezone

from _setup import scratch_django, scratch_warehouse

ROWS = int(os.environ.get("ROWS", "1000000"))
ROUNDS = int(os.environ.get("ROUNDS", "3"))
DAY = "2022-10-01"
START = datetime(2022, 10, 1, tzinfo=timezone.utc)

os.environ["WAREHOUSE_URL"], label = scratch_warehouse("stage_verify")
scratch_django("stage_verify")

from django.conf import settings  # noqa: E402
from django.contrib.auth.models import User  # noqa: E402

from backfill_portal.backends import get_warehouse  # noqa: E402
from backfill_portal.backfills import tasks as backfill_tasks  # noqa: E402, F401
from backfill_portal.backfills.services.requests import (  # noqa: E402
    backfill_request_create,
    backfill_request_decide,
    backfill_request_submit,
)
from backfill_portal.catalog.models import Job  # noqa: E402
from backfill_portal.catalog.services.sync import catalog_sync  # noqa: E402
from backfill_portal.catalog.specs import spec_for  # noqa: E402
from backfill_portal.celery import app  # noqa: E402
from backfill_portal.execution import queue as outbox  # noqa: E402
from backfill_portal.execution import tasks  # noqa: E402, F401
from backfill_portal.execution.models import Run  # noqa: E402
from backfill_portal.recovery import tasks as recovery_tasks  # noqa: E402, F401

settings.DEBUG = False  # as deployed: no per-query logging
settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"  # approval mails kept, not printed
warehouse = get_warehouse()
pg = warehouse.dialect == "postgresql"
iceberg = warehouse.dialect == "duckdb"  # the Iceberg backend: tables through pyiceberg

CATALOG = """
version: 1
teams:
  - {name: bench, max_concurrent_runs: 8}
pools:
  - {name: bench, slots: 8, reserved_for_production: 2}
datasets:
  - name: bench_events
    source: true
    owner: olivia
    team: bench
    timezone: UTC
    grain: day
    time_column: event_time
    business_key: [event_id]
    core_measure: amount
    columns:
      - {name: event_id, type: text}
      - {name: customer_id, type: text}
      - {name: amount, type: numeric}
      - {name: event_time, type: timestamp}
  - name: bench_daily
    owner: olivia
    team: bench
    timezone: UTC
    grain: day
    business_key: [event_id]
    core_measure: amount
    partition_column: ds
    columns:
      - {name: event_id, type: text}
      - {name: customer_id, type: text}
      - {name: ds, type: text}
      - {name: amount, type: numeric}
      - {name: event_time, type: timestamp}
jobs:
  - name: bench_daily
    produces: bench_daily
    reads: [bench_events]
    kind: sql
    pool: bench
    sql: |
      SELECT e.event_id, e.customer_id, {{ partition_key }} AS ds, e.amount, e.event_time
      FROM {{ ref('bench_events') }} AS e
"""


def iceberg_table(name: str, arrow_schema):
    """A plain Iceberg table of the backend's namespace (pyiceberg), created empty."""
    return warehouse.catalog.create_table(f"{warehouse.namespace}.{name}", schema=arrow_schema)


def load_source() -> None:
    """ROWS events spread over DAY (the i-th at i/ROWS of it), made by the warehouse itself
    (on Iceberg: by DuckDB, appended to a plain Iceberg table with pyiceberg)."""
    if iceberg:
        events = warehouse.duck.sql(f"""
            SELECT 'e' || g AS event_id, 'c' || ((CAST(g AS BIGINT) * 7919) % 50000) AS customer_id,
                   ROUND((g % 1000) / 10.0, 2) AS amount,
                   TIMESTAMPTZ '{DAY} 00:00:00+00' + to_microseconds(CAST(g AS BIGINT) * {86_400_000_000 // ROWS})
                     AS event_time
            FROM range({ROWS}) AS t(g)""").to_arrow_table()
        iceberg_table("bench_events", events.schema).append(events)
    elif pg:
        warehouse.execute('CREATE TABLE "bench_events" (event_id text, customer_id text, amount numeric, '
                          "event_time timestamptz)")
        warehouse.execute(f"""INSERT INTO "bench_events"
            SELECT 'e' || g, 'c' || ((CAST(g AS BIGINT) * 7919) % 50000), ROUND(CAST((g % 1000) / 10.0 AS NUMERIC), 2),
                   TIMESTAMPTZ '{DAY} 00:00:00+00' + g * (INTERVAL '1 second' * {86400 / ROWS:.6f})
            FROM generate_series(0, {ROWS - 1}) AS g""")
        warehouse.execute('CREATE INDEX "bench_events_time" ON "bench_events" (event_time)')
        warehouse.execute('VACUUM ANALYZE "bench_events"')
    else:
        warehouse.execute('CREATE TABLE "bench_events" (event_id TEXT, customer_id TEXT, amount REAL, '
                          "event_time TEXT)")
        warehouse.execute(f"""INSERT INTO "bench_events"
            WITH RECURSIVE g(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM g WHERE i < {ROWS - 1})
            SELECT 'e' || i, 'c' || ((i * 7919) % 50000), ROUND((i % 1000) / 10.0, 2),
                   strftime('%Y-%m-%d %H:%M:%S', '{DAY} 00:00:00', '+' || (i * 86400 / {ROWS}) || ' seconds')
            FROM g""")
        warehouse.execute('CREATE INDEX "bench_events_time" ON "bench_events" (event_time)')
        warehouse.execute("ANALYZE")


t = time.perf_counter()
load_source()
catalog_sync(text=CATALOG)
job = Job.objects.select_related("dataset", "current_code_version").get(name="bench_daily")
spec = spec_for(job.dataset)
warehouse.ensure_dataset(spec)
print(f"{label} warehouse ({warehouse.dialect}): {ROWS} source rows loaded in {time.perf_counter() - t:.1f}s")

# The bare twin: the same SELECT, rendered for the same interval, into a plain table.
source = warehouse.source_sql(name="bench_events", time_column="event_time", start=START,
                              end=START + timedelta(days=1))
bare_select = (job.current_code_version.definition["sql"]
               .replace("{{ ref('bench_events') }}", source).replace("{{ partition_key }}", f"'{DAY}'"))
columns = ", ".join(f'"{name}"' for name in spec.column_names)
if iceberg:  # a plain Iceberg table of the declared columns
    bare_table = iceberg_table("bare_daily", warehouse.duck.sql(
        f"SELECT {columns} FROM ({bare_select}) AS q LIMIT 0").to_arrow_table().schema)
else:
    warehouse.execute(f'CREATE TABLE "bare_daily" AS SELECT {columns} FROM "{spec.name}" WHERE 1 = 0')


def settle() -> None:
    if pg:
        warehouse.execute("CHECKPOINT")


def bare() -> float:
    if iceberg:
        return bare_iceberg()
    warehouse.execute('TRUNCATE "bare_daily"' if pg else 'DELETE FROM "bare_daily"')
    settle()
    t0 = time.perf_counter()
    with warehouse.transaction():
        inserted = warehouse.execute(f'INSERT INTO "bare_daily" ({columns}) SELECT {columns} FROM ({bare_select}) AS q')
    elapsed = time.perf_counter() - t0
    assert inserted == ROWS, inserted
    return elapsed


def bare_iceberg() -> float:
    """The lakehouse's dangerous button: DuckDB runs the SELECT into Arrow, pyiceberg
    appends it to the emptied plain table (data file and commit)."""
    with warnings.catch_warnings():  # "did not match any records": the first round's table is empty
        warnings.simplefilter("ignore", UserWarning)
        bare_table.delete()
    t0 = time.perf_counter()
    rows = warehouse.duck.sql(f"SELECT {columns} FROM ({bare_select}) AS q").to_arrow_table()
    bare_table.append(rows)
    elapsed = time.perf_counter() - t0
    assert rows.num_rows == ROWS, rows.num_rows
    return elapsed


sent: deque = deque()
outbox.set_publisher(lambda task, args, headers, queue, eta=None: sent.append((task, args, headers)))
alice, olivia = User.objects.get(username="alice"), User.objects.get(username="olivia")
UNTIMED = {"backfills.reconcile_request"}
spent: dict[str, list[float]] = {}  # task -> [wall seconds, warehouse SQL seconds]
task_sql = [0.0]  # warehouse SQL seconds of the task running now
statements = {"staging write": 0.0, "source watermark": 0.0, "other warehouse SQL": 0.0}


def observed(call, statement):
    t0 = time.perf_counter()
    try:
        return call()
    finally:
        took = time.perf_counter() - t0
        task_sql[0] += took
        reads_source = '"bench_events"' in statement
        writes = any(verb in statement.upper() for verb in ("INSERT", "CREATE TABLE"))  # PostgreSQL: CREATE TABLE AS
        kind = ("staging write" if reads_source and writes else
                "source watermark" if reads_source else "other warehouse SQL")
        statements[kind] += took


def portal() -> float:
    """File, approve and run the one interval; timed until its version is published."""
    settle()
    t0 = time.perf_counter()
    request, _ = backfill_request_create(actor=alice, job=job.name, start=DAY, end=DAY, reason="benchmark")
    backfill_request_submit(actor=alice, request_id=request.pk, confirm_overlap=True)
    backfill_request_decide(actor=olivia, request_id=request.pk, approve=True)
    elapsed = time.perf_counter() - t0
    while sent:
        task, args, headers = sent.popleft()
        task_sql[0] = 0.0
        t1 = time.perf_counter()
        if iceberg:  # DuckDB and pyiceberg: no statement hook to observe
            app.tasks[task].apply(args=args, headers=headers, throw=True)
        else:
            with warehouse.execute_wrapper(observed):
                app.tasks[task].apply(args=args, headers=headers, throw=True)
        took = time.perf_counter() - t1
        if task not in UNTIMED:
            elapsed += took
            totals = spent.setdefault(task, [0.0, 0.0])
            totals[0] += took
            totals[1] += task_sql[0]
    run = Run.objects.get(request=request)
    assert run.status == "published", run.status
    marker = warehouse.marker(run.run_id)
    assert marker.row_count == ROWS, marker
    return elapsed


bare()  # warm both: the source's pages, the statements
portal()
spent.clear()
statements.update(dict.fromkeys(statements, 0.0))
bare_times, portal_times = [], []
bare_name = "append with pyiceberg" if iceberg else "INSERT ... SELECT"
for _ in range(ROUNDS):
    bare_times.append(bare())
    portal_times.append(portal())
b, p = statistics.median(bare_times), statistics.median(portal_times)
for task, (wall, sql) in sorted(spent.items(), key=lambda kv: -kv[1][0]):
    print(f"  {task:32s} {wall / ROUNDS:6.2f}s a round"
          + ("" if iceberg else f", of which warehouse SQL {sql / ROUNDS:6.2f}s"))
if not iceberg:
    print("  warehouse SQL a round: " + "; ".join(f"{kind} {took / ROUNDS:.2f}s" for kind, took in statements.items())
          + " (other: the marker's numbers and fingerprint where they are separate statements, checks, pointer)")
print(f"bare {bare_name} {b:.2f}s; portal (stage, numbers, fingerprint, checks, publish) {p:.2f}s "
      f"({ROUNDS} rounds, medians; each round's: bare {', '.join(f'{x:.2f}' for x in bare_times)}, "
      f"portal {', '.join(f'{x:.2f}' for x in portal_times)})")
print(f"ratio: {p / b:.2f} (one {ROWS}-row interval through the portal / the bare {bare_name} "
      f"of the same rows, {label} warehouse)")
