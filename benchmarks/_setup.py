"""Shared set-up for benchmarks: a scratch metadata database (a temporary SQLite file,
or a scratch PostgreSQL database when DATABASE_URL names PostgreSQL), migrated, with
the demo users and catalog."""
from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import date, datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def scratch_db_name(name: str, base: str) -> str:
    """The scratch PostgreSQL database of benchmark `name` for DATABASE_URL `base`:
    bench_<name>_<base's database>, so that benchmarks run against different
    databases of one server (two engineers, CI) do not drop each other's."""
    base_db = base.rsplit("/", 1)[1].split("?")[0]
    return f"bench_{name}_{base_db}" if base_db and not base_db.startswith("bench_") else f"bench_{name}"


def scratch_django(name: str) -> str:
    """Point Django at a fresh scratch database and set it up. Returns a label."""
    base = os.environ.get("DATABASE_URL", "")
    if base.startswith("postgres"):
        import psycopg

        admin = base.rsplit("/", 1)[0] + "/postgres"
        db = scratch_db_name(name, base)
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{db}"')
        os.environ["DATABASE_URL"] = base.rsplit("/", 1)[0] + "/" + db
        label = "PostgreSQL"
    else:
        tmp = tempfile.mkdtemp(prefix=f"bench_{name}_")
        os.environ["DATABASE_URL"] = f"sqlite:///{tmp}/portal.sqlite3"
        os.environ.setdefault("WAREHOUSE_URL", f"sqlite:///{tmp}/warehouse.sqlite3")
        label = "SQLite"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "backfill_portal.settings")
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    call_command("load_demo", no_data=True, verbosity=0)
    return label


def scratch_warehouse(name: str) -> tuple[str, str]:
    """A fresh, empty warehouse for benchmark `name`, as (url, label): a scratch
    PostgreSQL database beside WAREHOUSE_URL's when that names PostgreSQL (dropped and
    created, named as `scratch_db_name` names metadata ones); when it names an Iceberg
    catalog (iceberg+sqlite:... or iceberg+postgresql://...), a scratch catalog of the
    same kind with its files in a new temporary directory; else a new SQLite file.
    Benchmarks that need only the warehouse use it with `make_warehouse(url)`, no Django."""
    base = os.environ.get("WAREHOUSE_URL", "")
    if base.startswith("iceberg+"):  # a scratch catalog, its files in a new directory
        files = tempfile.mkdtemp(prefix=f"bench_{name}_")
        catalog = base.removeprefix("iceberg+").split("?")[0]
        if catalog.startswith("postgres"):
            return f"iceberg+{_scratch_pg(name, catalog)}?warehouse={files}/iceberg", "Iceberg (PostgreSQL catalog)"
        return f"iceberg+sqlite:///{files}/catalog.db?warehouse={files}/iceberg", "Iceberg (SQLite catalog)"
    if base.startswith("postgres"):
        return _scratch_pg(name, base), "PostgreSQL"
    tmp = tempfile.mkdtemp(prefix=f"bench_{name}_")
    return f"sqlite:///{tmp}/warehouse.sqlite3", "SQLite"


def _scratch_pg(name: str, base: str) -> str:
    """A dropped and created PostgreSQL database beside `base`'s, its URL."""
    import psycopg

    db = scratch_db_name(name, base)
    with psycopg.connect(base.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{db}"')
    return base.rsplit("/", 1)[0] + "/" + db


def wait_while_request_is(request_id: int, *, states: tuple[str, ...] = ("approved", "running"),
                          interval: float) -> str:
    """Poll the request's status every `interval` seconds while it is one of `states`;
    return the status it left them for. One statement on a raw cursor, not the ORM, so
    that the polling takes as little as it can of the CPU a worker is being timed on (a
    shorter interval sees the end sooner and costs more of it)."""
    from django.db import connection

    from backfill_portal.backfills.models import BackfillRequest

    table = connection.ops.quote_name(BackfillRequest._meta.db_table)
    with connection.cursor() as cursor:
        while True:
            cursor.execute(f"SELECT status FROM {table} WHERE id = %s", [request_id])
            status = cursor.fetchone()[0]
            if status not in states:
                return status
            time.sleep(interval)


def alternately(first: Callable[[], object], second: Callable[[], object], n: int) -> tuple[list[float], list[float]]:
    """Time `first` and `second` n times each, interleaved, so machine load hits both
    alike. Returns their durations in seconds."""
    first_t, second_t = [], []
    for _ in range(n):
        t = time.perf_counter()
        first()
        first_t.append(time.perf_counter() - t)
        t = time.perf_counter()
        second()
        second_t.append(time.perf_counter() - t)
    return first_t, second_t


# -- the reader-cost dataset: benchmarks/reader_cost.py on every backend -------------------
# (reader_cost_iceberg.py is its Iceberg side: the same dataset, read as Iceberg readers read)

READER_PARTITIONS = int(os.environ.get("PARTITIONS", "30"))
READER_ROWS = int(os.environ.get("ROWS_PER_PARTITION", "10000"))
READER_REPEAT = int(os.environ.get("REPEAT", "15"))
READER_VERSIONS = 3
READER_DAYS = [date(2022, 10, 1) + timedelta(days=i) for i in range(READER_PARTITIONS)]
READER_PLAIN = "orders_plain"


def reader_spec():
    """`orders_read`: daily partitions (partition column `ds`) of orders, indexes
    declared on `order_id`, `created_at` and `ship_date` (a backend without indexes
    ignores them)."""
    from backfill_portal.backends import DatasetSpec

    return DatasetSpec(
        name="orders_read",
        columns=(("order_id", "text"), ("customer_id", "text"), ("ds", "text"), ("ship_date", "date"),
                 ("created_at", "timestamp"), ("status", "text"), ("amount", "numeric")),
        business_key=("order_id",),
        core_measure="amount",
        partition_column="ds",
        indexes=(("order_id",), ("created_at",), ("ship_date",)),
    )


def reader_day_start(day: date) -> datetime:
    return datetime(day.year, day.month, day.day, tzinfo=timezone.utc)


def reader_rows_sql(dialect: str) -> str:
    """READER_ROWS orders of one day in the engine's dialect (sqlite, postgresql, duckdb),
    the same rows on every engine; parameters: day (text) three times, the day's start
    (the engine's timestamp), version / 100 (shifts the amounts, as a backfill would).
    ship_date falls 0-6 days after the order."""
    rows = READER_ROWS
    if dialect == "postgresql":
        return f"""
            SELECT CAST(? AS TEXT) || '-' || g AS order_id,
                   'c' || ((CAST(g AS BIGINT) * 7919) % 50000) AS customer_id,
                   CAST(? AS TEXT) AS ds,
                   CAST(? AS DATE) + (g % 7) AS ship_date,
                   CAST(? AS TIMESTAMPTZ) + g * (INTERVAL '1 second' * {86400 / rows:.6f}) AS created_at,
                   (ARRAY['created', 'paid', 'shipped', 'refunded'])[1 + g % 4] AS status,
                   ROUND(CAST((g % 1000) / 10.0 + ? AS NUMERIC), 2) AS amount
            FROM generate_series(1, {rows}) AS g"""
    if dialect == "duckdb":
        return f"""
            SELECT CAST(? AS VARCHAR) || '-' || g AS order_id,
                   'c' || ((CAST(g AS BIGINT) * 7919) % 50000) AS customer_id,
                   CAST(? AS VARCHAR) AS ds,
                   CAST(? AS DATE) + CAST(g % 7 AS INTEGER) AS ship_date,
                   CAST(? AS TIMESTAMPTZ) + to_microseconds(CAST(g AS BIGINT) * {86_400_000_000 // rows}) AS created_at,
                   (['created', 'paid', 'shipped', 'refunded'])[1 + g % 4] AS status,
                   ROUND((g % 1000) / 10.0 + ?, 2) AS amount
            FROM generate_series(1, {rows}) AS t(g)"""
    return f"""
        WITH RECURSIVE g(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM g WHERE i < {rows})
        SELECT CAST(? AS TEXT) || '-' || i AS order_id,
               'c' || ((i * 7919) % 50000) AS customer_id,
               CAST(? AS TEXT) AS ds,
               date(?, '+' || (i % 7) || ' days') AS ship_date,
               strftime('%Y-%m-%d %H:%M:%S', ?, '+' || (i * 86400 / {rows}) || ' seconds') AS created_at,
               CASE i % 4 WHEN 0 THEN 'created' WHEN 1 THEN 'paid' WHEN 2 THEN 'shipped' ELSE 'refunded' END AS status,
               ROUND((i % 1000) / 10.0 + ?, 2) AS amount
        FROM g"""


def reader_rows_params(warehouse, day: date, version: int) -> tuple:
    """reader_rows_sql's parameters for one version of one day on `warehouse`."""
    key = day.isoformat()
    start = key if warehouse.dialect == "postgresql" else warehouse.ts(reader_day_start(day))
    return (key, key, key, start, version / 100)
