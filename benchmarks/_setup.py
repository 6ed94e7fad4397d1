"""Shared set-up for benchmarks: a scratch metadata database (a temporary SQLite file,
or a scratch PostgreSQL database when DATABASE_URL names PostgreSQL), migrated, with
the demo users and catalog."""
from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable
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
    created, named as `scratch_db_name` names metadata ones), else a new SQLite file.
    Benchmarks that need only the warehouse use it with `make_warehouse(url)`, no Django."""
    base = os.environ.get("WAREHOUSE_URL", "")
    if base.startswith("postgres"):
        import psycopg

        db = scratch_db_name(name, base)
        with psycopg.connect(base.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{db}"')
        return base.rsplit("/", 1)[0] + "/" + db, "PostgreSQL"
    tmp = tempfile.mkdtemp(prefix=f"bench_{name}_")
    return f"sqlite:///{tmp}/warehouse.sqlite3", "SQLite"


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
