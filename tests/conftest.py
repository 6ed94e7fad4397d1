"""Shared fixtures: named personas (as Healthchecks' alice/bob/charlie) and a small catalog."""
from __future__ import annotations

import contextlib
import os
import textwrap

import pytest
from django.contrib.auth.models import Group, User
from rest_framework.test import APIClient

from backfill_portal.catalog.services.sync import catalog_sync
from backfill_portal.core.roles import Role

# The real-worker fixture (`start_worker`), for tests/execution and tests/ops.
pytest_plugins = ["tests.workers"]

PERSONAS = {
    "alice": [Role.REQUESTER],
    "olivia": [Role.OWNER, Role.REQUESTER],
    "sam": [Role.OWNER, Role.REQUESTER],
    "rita": [Role.OWNER],
    "finn": [Role.OWNER],
    "oscar": [Role.ONCALL],
    "audrey": [Role.AUDITOR],
    "outsider": [],
}

TEST_CATALOG = textwrap.dedent(
    """
    version: 1
    teams:
      - {name: ingestion}
      - {name: core-data}
      - {name: analytics}
      - {name: finance}
    pools:
      - {name: warehouse, slots: 8, reserved_for_production: 2}
    datasets:
      - name: ods_order_events
        source: true
        owner: olivia
        team: ingestion
        timezone: Asia/Shanghai
        grain: day
        time_column: event_time
        business_key: [event_id]
        core_measure: amount
        columns:
          - {name: event_id, type: text}
          - {name: order_id, type: text}
          - {name: item_id, type: text}
          - {name: customer_id, type: text}
          - {name: category, type: text}
          - {name: amount, type: numeric}
          - {name: status, type: text}
          - {name: event_time, type: timestamp}
          - {name: updated_at, type: timestamp}
          - {name: ingested_at, type: timestamp}
      - name: dwd_order_items
        owner: olivia
        team: core-data
        timezone: Asia/Shanghai
        grain: day
        business_key: [order_id, item_id]
        core_measure: amount
        columns:
          - {name: order_id, type: text}
          - {name: item_id, type: text}
          - {name: category, type: text}
          - {name: amount, type: numeric}
      - name: dwd_order_items_py
        owner: olivia
        team: core-data
        timezone: Asia/Shanghai
        grain: day
        business_key: [order_id, item_id]
        core_measure: amount
        columns:
          - {name: order_id, type: text}
          - {name: item_id, type: text}
          - {name: category, type: text}
          - {name: amount, type: numeric}
      - name: slow_items
        owner: olivia
        team: core-data
        timezone: Asia/Shanghai
        grain: day
        business_key: [n]
        columns:
          - {name: n, type: integer}
          - {name: label, type: text}
      - name: dws_sales_daily
        owner: sam
        team: analytics
        timezone: Asia/Shanghai
        grain: day
        business_key: [ds, category]
        core_measure: gmv
        columns:
          - {name: ds, type: text}
          - {name: category, type: text}
          - {name: gmv, type: numeric}
        source_measure_sql: "SELECT SUM(d.amount) FROM {{ ref('dwd_order_items') }} AS d"
      - name: notify_finance
        owner: finn
        team: finance
        timezone: Asia/Shanghai
        grain: day
        business_key: [idempotency_key]
        columns:
          - {name: ds, type: text}
          - {name: channel, type: text}
          - {name: message, type: text}
          - {name: idempotency_key, type: text}
      - name: page_views_hourly
        owner: olivia
        team: core-data
        timezone: America/New_York
        grain: hour
        business_key: [page]
        columns:
          - {name: page, type: text}
          - {name: views, type: integer}
      - name: monthly_summary
        owner: rita
        team: finance
        timezone: Europe/London
        grain: month
        business_key: [category]
        columns:
          - {name: category, type: text}
          - {name: gmv, type: numeric}
    jobs:
      - name: dwd_order_items
        produces: dwd_order_items
        reads: [ods_order_events]
        kind: sql
        pool: warehouse
        sql: |
          SELECT order_id, item_id, category, amount FROM (
            SELECT e.*, ROW_NUMBER() OVER (PARTITION BY order_id, item_id ORDER BY updated_at DESC, event_id DESC) AS rn
            FROM {{ ref('ods_order_events') }} AS e WHERE item_id IS NOT NULL
          ) AS latest WHERE rn = 1
      - name: dws_sales_daily
        produces: dws_sales_daily
        reads: [dwd_order_items]
        kind: sql
        pool: warehouse
        sql: |
          SELECT {{ partition_key }} AS ds, category, ROUND(CAST(SUM(amount) AS NUMERIC), 2) AS gmv
          FROM {{ ref('dwd_order_items') }} AS d GROUP BY category
      - name: notify_finance
        produces: notify_finance
        reads: [dws_sales_daily]
        kind: side_effect
        pool: warehouse
        side_effect: {channel: finance-email}
      - name: dwd_order_items_py
        produces: dwd_order_items_py
        reads: [ods_order_events]
        kind: python
        pool: warehouse
        max_attempts: 3
        callable: tests.execution.jobs.order_items
      - name: slow_items
        produces: slow_items
        reads: []
        kind: python
        pool: warehouse
        max_attempts: 3
        heartbeat_timeout_seconds: 3
        callable: tests.execution.jobs.slow_items
      - name: page_views_hourly
        produces: page_views_hourly
        reads: []
        kind: sql
        pool: warehouse
        sql: "SELECT 'home' AS page, 1 AS views"
      - name: monthly_summary
        produces: monthly_summary
        reads: [dws_sales_daily]
        kind: sql
        pool: warehouse
        sql: "SELECT category, SUM(gmv) AS gmv FROM {{ ref('dws_sales_daily') }} AS s GROUP BY category"
    """
)


# Two more layers under dws_sales_daily, added to TEST_CATALOG only by the tests that
# need depth (tests/reconciliation/helpers.catalog_text(deep=True)): adding them to
# TEST_CATALOG itself would change every cascade from dws_sales_daily. ads_gmv_report
# is the day's total; gmv_to_date is cumulative (depends_on_past: each partition reads
# the previous one through ref_previous()).
DEPTH_CATALOG = textwrap.dedent(
    """
    datasets:
      - name: ads_gmv_report
        owner: rita
        team: finance
        timezone: Asia/Shanghai
        grain: day
        business_key: [ds]
        core_measure: gmv
        columns:
          - {name: ds, type: text}
          - {name: gmv, type: numeric}
      - name: gmv_to_date
        owner: finn
        team: finance
        timezone: Asia/Shanghai
        grain: day
        business_key: [ds]
        core_measure: gmv
        columns:
          - {name: ds, type: text}
          - {name: gmv, type: numeric}
    jobs:
      - name: ads_gmv_report
        produces: ads_gmv_report
        reads: [dws_sales_daily]
        kind: sql
        pool: warehouse
        sql: |
          SELECT {{ partition_key }} AS ds, ROUND(CAST(COALESCE(SUM(s.gmv), 0) AS NUMERIC), 2) AS gmv
          FROM {{ ref('dws_sales_daily') }} AS s
      - name: gmv_to_date
        produces: gmv_to_date
        reads: [ads_gmv_report]
        kind: sql
        pool: warehouse
        depends_on_past: true
        max_concurrent_runs: 1
        sql: |
          SELECT {{ partition_key }} AS ds, ROUND(CAST(SUM(u.gmv) AS NUMERIC), 2) AS gmv FROM (
            SELECT p.gmv AS gmv FROM {{ ref_previous() }} AS p
            UNION ALL
            SELECT a.gmv AS gmv FROM {{ ref('ads_gmv_report') }} AS a
          ) AS u
    """
)


@pytest.fixture(scope="session", autouse=True)
def run_log_dir(tmp_path_factory):
    """The run logs (`RUN_LOG_DIR/<run_id>.jsonl`) of the whole session go to one
    temporary folder, never the checkout's var/log/runs: for this process (the setting)
    and for every process a test starts with this environment (real workers, beat,
    servers, manage.py). A test that reads its own run logs still sets its own."""
    from django.conf import settings

    path = str(tmp_path_factory.mktemp("run-logs"))
    before_env, before_setting = os.environ.get("RUN_LOG_DIR"), settings.RUN_LOG_DIR
    os.environ["RUN_LOG_DIR"] = settings.RUN_LOG_DIR = path
    yield path
    settings.RUN_LOG_DIR = before_setting
    if before_env is None:
        os.environ.pop("RUN_LOG_DIR", None)
    else:
        os.environ["RUN_LOG_DIR"] = before_env


@pytest.fixture(autouse=True)
def audit_anchor_path(settings, tmp_path):
    """Each test anchors the audit log in its own file, never in the worktree's var/."""
    settings.AUDIT_ANCHOR_PATH = tmp_path / "audit-anchors.jsonl"
    return settings.AUDIT_ANCHOR_PATH


@pytest.fixture(scope="session", autouse=True)
def flush_lifts_the_audit_triggers():
    """Between transactional tests Django empties every table, which the audit table's
    triggers refuse on PostgreSQL, as they should to anyone. The test runner, and only
    it, does what an owner resetting a scratch database would: switch the trigger off
    for the emptying, in the same transaction.

    And it empties them with DELETE rather than Django's one TRUNCATE of every table:
    on the shared CI machine that TRUNCATE took ~3 s a test (it makes every table's
    files anew) where the DELETEs of the same, small tables take ~0.2 s. The end is the
    same, every table empty: the foreign keys are deferred (Django makes them
    DEFERRABLE INITIALLY DEFERRED), so they are checked at commit, when the rows on
    both sides are gone; sequences go on as they do after a TRUNCATE without RESTART
    IDENTITY. A flush that asks to reset sequences or to cascade to tables outside the
    list keeps Django's TRUNCATE."""
    from django.db.backends.postgresql.operations import DatabaseOperations

    from backfill_portal.core.dbroles import AUDIT_TABLE, AUDIT_TRIGGERS, TRUNCATE_TRIGGER

    original = DatabaseOperations.sql_flush
    append_only = next(t for t in AUDIT_TRIGGERS if t != TRUNCATE_TRIGGER)

    def sql_flush(self, style, tables, *, reset_sequences=False, allow_cascade=False):
        if not tables:
            return []
        if reset_sequences or allow_cascade:
            statements = original(self, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade)
            trigger = TRUNCATE_TRIGGER
        else:
            statements = [f"DELETE FROM {self.quote_name(table)}" for table in tables]
            trigger = append_only
        if AUDIT_TABLE not in tables:
            return statements
        return [f"ALTER TABLE {AUDIT_TABLE} DISABLE TRIGGER {trigger}", *statements,
                f"ALTER TABLE {AUDIT_TABLE} ENABLE TRIGGER {trigger}"]

    DatabaseOperations.sql_flush = sql_flush
    yield
    DatabaseOperations.sql_flush = original


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings):
    # PBKDF2's deliberate slowness costs seconds per persona; tests need no strength.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def _no_retry_backoff(settings):
    # The in-process task queue runs a retry as soon as it is sent, without the broker
    # holding it to its backoff; the backoff's own tests set it.
    settings.RETRY_BACKOFF_SECONDS = 0


def needs_postgresql(why: str = "concurrent transactions"):
    """The mark of a test that races transactions: PostgreSQL's (CI's second pass)."""
    from django.db import connection

    return pytest.mark.skipif(connection.vendor != "postgresql",
                              reason=f"needs PostgreSQL: {why} (CI's second pass runs it)")


def waiting_backends() -> int:
    """How many of this test database's PostgreSQL sessions wait on a lock now (the race
    tests hold one, start their callers, and wait until each is blocked on it)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")  # inside a transaction the view is a snapshot
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                       "AND wait_event_type = 'Lock'")
        return cursor.fetchone()[0]


def started_until_waiting(call, *, what: str) -> tuple:
    """`call()` in a thread of its own, returned once it waits on a lock this test's
    transaction holds (PostgreSQL): (the thread, its outcome list, which gets the
    result or the exception raised). The thread closes its connections when done."""
    import threading
    import time

    from django.db import connections

    outcome: list = []

    def run():
        try:
            outcome.append(call())
        except Exception as exc:  # noqa: BLE001 - the test asserts on it
            outcome.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 30
    while waiting_backends() < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert waiting_backends() >= 1, f"{what} should be waiting for a lock this test holds"
    return thread, outcome


@contextlib.contextmanager
def frozen_once_holding(argv: list[str], *, env: dict, cwd):
    """A Python process (`argv` after the interpreter) started and stopped (SIGSTOP) as
    soon as it prints "holding" (it took what it holds), yielded; killed at the end.
    stdin is a pipe, for a test that lets it go on (SIGCONT) and talks to it."""
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, *argv], cwd=cwd, env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.strip() == "holding", f"it did not start: {line!r} {proc.stderr.read() if proc.poll() is not None else ''}"
        os.kill(proc.pid, signal.SIGSTOP)
        yield proc
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
        proc.wait(timeout=30)


def make_user(username: str, roles) -> User:
    user = User.objects.create_user(username=username, password="pw-" + username, email=f"{username}@example.com")
    for role in roles:
        group, _ = Group.objects.get_or_create(name=role)
        user.groups.add(group)
    return user


@pytest.fixture
def personas(db) -> dict[str, User]:
    users = {name: make_user(name, roles) for name, roles in PERSONAS.items()}
    users["admin"] = User.objects.create_superuser("admin", "admin@example.com", "pw-admin")
    return users


@pytest.fixture
def alice(personas):
    return personas["alice"]


@pytest.fixture
def olivia(personas):
    return personas["olivia"]


@pytest.fixture
def sam(personas):
    return personas["sam"]


@pytest.fixture
def oscar(personas):
    return personas["oscar"]


@pytest.fixture
def audrey(personas):
    return personas["audrey"]


@pytest.fixture
def catalog(personas):
    return catalog_sync(text=TEST_CATALOG)


@pytest.fixture
def api(personas):
    """api('alice') -> an APIClient logged in as that persona."""

    def client_for(name: str) -> APIClient:
        client = APIClient()
        client.force_authenticate(personas[name])
        return client

    return client_for


# --- The warehouse: a fresh one per test (a SQLite file, or an emptied PostgreSQL
# database when WAREHOUSE_URL names PostgreSQL, as in CI's second pass).

def _pg_url_with_db(url: str, dbname: str) -> str:
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + dbname, parts.query, parts.fragment))


class WarehouseDatabases:
    """Throwaway PostgreSQL warehouse databases for one test session, each handed to one
    test at a time and emptied when it gives it back. A CREATE DATABASE and a DROP
    DATABASE per test took ~0.5 s and ~2-3 s on the loaded CI machine (the DROP waits
    for a checkpoint); emptying one takes ~0.25 s. Emptied is as good as new for a
    warehouse: every session still connected to it is ended first, as DROP DATABASE
    ... WITH (FORCE) does (a worker frozen in its staging transaction, the live
    server's thread), then every schema of its own is dropped with all it holds
    (tables, views, the bookkeeping `_bf_*` tables) and `public` is made again. The databases are
    dropped at the end of the session."""

    def __init__(self, base: str):
        import uuid

        self.base = base
        self.admin_url = _pg_url_with_db(base, "postgres")
        self.prefix = f"bfwh_{uuid.uuid4().hex[:8]}_"
        self.made: list[str] = []
        self.free: list[str] = []

    def _admin(self):
        import psycopg

        return psycopg.connect(self.admin_url, autocommit=True)

    def take(self) -> str:
        if self.free:
            return _pg_url_with_db(self.base, self.free.pop())
        name = f"{self.prefix}{len(self.made)}"
        with self._admin() as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        self.made.append(name)
        return _pg_url_with_db(self.base, name)

    def give_back(self, url: str) -> None:
        import psycopg

        name = url.rsplit("/", 1)[1].split("?")[0]
        try:
            with self._admin() as conn:
                conn.execute("SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity "
                             "WHERE datname = %s AND pid <> pg_backend_pid()", [name])
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("SET lock_timeout = '30s'")
                schemas = [row[0] for row in conn.execute(
                    "SELECT nspname FROM pg_namespace WHERE nspname NOT LIKE 'pg\\_%' AND nspname <> 'information_schema'")]
                for schema in schemas:
                    conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
                conn.execute("CREATE SCHEMA public AUTHORIZATION pg_database_owner")  # as a new database has it
                conn.execute("GRANT USAGE ON SCHEMA public TO PUBLIC")
        except psycopg.Error:
            return  # not reused: dropped with the others at the end
        self.free.append(name)

    def drop_all(self) -> None:
        with self._admin() as conn:
            for name in self.made:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def warehouse_databases():
    import os

    base = os.environ.get("WAREHOUSE_URL", "")
    if not base.startswith("postgres"):
        yield None
        return
    pool = WarehouseDatabases(base)
    yield pool
    pool.drop_all()


def iceberg_url(tmp_path) -> str:
    """An Iceberg warehouse under `tmp_path`: pyiceberg's SQL catalog in a SQLite file."""
    return f"iceberg+sqlite:///{tmp_path / 'catalog.db'}?warehouse={tmp_path / 'iceberg'}"


@pytest.fixture(scope="session")
def s3_endpoint():
    """An S3 API server for the session: moto's, a real HTTP server in a process of its
    own, which pyarrow's S3 client (the portal's and pyiceberg's) talks to as to S3.
    The object-store variants do not depend on the pass's metadata database or
    warehouse, so they run once: in the embedded pass, not again in CI's PostgreSQL one."""
    import os
    import socket
    import subprocess
    import sys
    import time

    if os.environ.get("WAREHOUSE_URL", "").startswith("postgres"):
        pytest.skip("the object-store (S3) variants run in the embedded pass; this pass's WAREHOUSE_URL is PostgreSQL")

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                pytest.fail("moto's S3 server did not start")
            time.sleep(0.1)
    yield f"http://127.0.0.1:{port}"
    server.terminate()
    server.wait(10)


def iceberg_s3_url(tmp_path, endpoint: str) -> str:
    """An Iceberg warehouse in a new bucket of the S3 server at `endpoint` (the catalog
    in a SQLite file under `tmp_path`); a killed writer's lease lapses after 2 s."""
    import uuid

    from pyarrow.fs import S3FileSystem

    bucket = f"bf-{uuid.uuid4().hex[:12]}"
    S3FileSystem(endpoint_override=endpoint, access_key="portal", secret_key="portal-secret", region="us-east-1",
                 allow_bucket_creation=True).create_dir(bucket)
    return (f"iceberg+sqlite:///{tmp_path / 'catalog.db'}?warehouse=s3://{bucket}/wh&s3.endpoint={endpoint}"
            "&s3.region=us-east-1&s3.access-key-id=portal&s3.secret-access-key=portal-secret&writer_lease=2")


#: A test that concerns the warehouse runs on the pass's warehouse (SQLite, or CI's
#: PostgreSQL) and on an Iceberg one (issue #18): `warehouse_url`'s fixture option.
ALSO_ON_ICEBERG = pytest.mark.parametrize("warehouse_url", ["default", "iceberg", "iceberg-s3"], indirect=True)


@pytest.fixture
def warehouse_url(request, settings, tmp_path, warehouse_databases):
    """The test's warehouse; parametrised indirectly with "iceberg" (ALSO_ON_ICEBERG), an
    Iceberg warehouse under tmp_path whatever the pass's warehouse is, or "iceberg-s3",
    one in a bucket of the session's S3 API server."""
    from backfill_portal.backends import reset_warehouse_cache

    param = getattr(request, "param", "default")
    pool = None if param.startswith("iceberg") else warehouse_databases
    if pool:
        url = pool.take()
    elif param == "iceberg":
        url = iceberg_url(tmp_path)
    elif param == "iceberg-s3":
        url = iceberg_s3_url(tmp_path, request.getfixturevalue("s3_endpoint"))
    else:
        url = f"sqlite:///{tmp_path / 'warehouse.sqlite3'}"
    settings.WAREHOUSE_URL = url
    reset_warehouse_cache()
    yield url
    reset_warehouse_cache()  # closes this thread's connections
    if pool:
        pool.give_back(url)


@pytest.fixture
def warehouse(warehouse_url):
    from backfill_portal.backends import get_warehouse

    return get_warehouse(warehouse_url)


@pytest.fixture
def demo_sources(warehouse):
    """Small, deterministic source data for 2022-09-28 .. 2022-10-08."""
    from datetime import date

    from backfill_portal.web.demo.sources import load_demo_sources

    return load_demo_sources(warehouse, first=date(2022, 9, 28), last=date(2022, 10, 8),
                             orders_per_day=150, page_views_per_hour=20)


class TaskQueue:
    """Stands in for the broker: collects what the outbox sends, and runs it in order
    with Celery's own `apply` (the real task functions, executed in this process)."""

    def __init__(self):
        from collections import deque

        self.sent = deque()
        self.ran: list[tuple[str, list, object]] = []
        # Every send's (task, args, eta): the delivery time a real broker would hold it to.
        self.etas: list[tuple[str, list, object]] = []

    def publish(self, task, args, headers, queue, eta=None):
        self.sent.append((task, list(args), dict(headers), queue))
        self.etas.append((task, list(args), eta))

    def drain(self, *, limit: int = 5000, skip=lambda task, args: False) -> list:
        """Run queued tasks in order (and what they enqueue) until none is left.
        Tasks for which `skip` is true stay queued, as undelivered messages would."""
        from backfill_portal.celery import app
        import backfill_portal.backfills.tasks  # noqa: F401  (registers the tasks)
        import backfill_portal.execution.tasks  # noqa: F401
        import backfill_portal.recovery.tasks  # noqa: F401

        done, kept = [], []
        while self.sent and len(done) < limit:
            task, args, headers, queue = self.sent.popleft()
            if skip(task, args):
                kept.append((task, args, headers, queue))
                continue
            result = app.tasks[task].apply(args=args, headers=headers, throw=True).get()
            done.append((task, args, result))
        self.sent.extendleft(reversed(kept))
        self.ran.extend(done)
        return done

    def drain_to_staged(self) -> list:
        """Run queued tasks as `drain` does, except that each run's attempt goes through
        the `run_execute` service alone, without the execute task's verification in the
        same task: the runs stop `staged`, their verify messages left undelivered (as
        a reclaimed verification, or a verify message still in the broker, leaves them)."""
        from backfill_portal.execution.services.runs import run_execute

        done = []
        while True:
            done += self.drain(skip=lambda task, args: task in ("execution.execute_run", "execution.verify_run"))
            executes = [m for m in self.sent if m[0] == "execution.execute_run"]
            if not executes:
                return done
            for message in executes:
                self.sent.remove(message)
                done.append((message[0], message[1], run_execute(run_id=message[1][0])))


@pytest.fixture
def task_queue():
    from backfill_portal.execution.queue import use_publisher

    queue = TaskQueue()
    with use_publisher(queue.publish):
        yield queue
