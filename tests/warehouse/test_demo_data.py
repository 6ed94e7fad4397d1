"""The synthetic demo sources (web/demo/sources.py) and the demo catalog's SQL
(web/demo/catalog.yaml), on SQLite and, when reachable, PostgreSQL 15.

The templates are rendered here by a small stand-in for the executor: `ref()` of a
source is its rows in the data interval, `ref()` of a produced dataset is that
dataset's result for the same day materialised by this test, and `ref_previous()` is
the previous day's result or an empty, typed subquery."""
from __future__ import annotations

import re
import uuid
from collections import Counter, defaultdict
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from zoneinfo import ZoneInfo

import jinja2
import pytest
import yaml

import backfill_portal
from backfill_portal.backends import make_warehouse
from backfill_portal.backends.sql import SqlWarehouse
from backfill_portal.catalog.choices import COLUMN_TYPES
from backfill_portal.web.demo import sources as demo_data
from backfill_portal.web.demo.sources import (
    ORDER_EVENTS,
    PAGE_EVENTS,
    correct_source_day,
    load_demo_sources,
    local_day_bounds,
)

PG_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
CATALOG_PATH = Path(backfill_portal.__file__).parent / "web" / "demo" / "catalog.yaml"
DEMO_USERS = {"alice", "olivia", "sam", "rita", "finn", "oscar", "audrey", "admin"}

# Three Shanghai business days; New York falls back on Sunday 2022-11-06 (a 25-hour day).
DAYS = [date(2022, 11, 5), date(2022, 11, 6), date(2022, 11, 7)]
SMALL = dict(first=DAYS[0], last=DAYS[-1], orders_per_day=200, page_views_per_hour=20, seed=7)
DAILY_JOBS = ["dwd_order_items", "dws_sales_daily", "dws_customer_cumulative", "ads_gmv_report"]


# -- databases ------------------------------------------------------------------------
def _pg_unreachable_reason() -> str | None:
    try:
        import psycopg

        with psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=3):
            return None
    except Exception as exc:  # noqa: BLE001 - any failure means: skip
        return f"PostgreSQL not reachable at {PG_ADMIN_URL}: {exc}".strip()


_PG_REASON: list = []


def _require_pg() -> None:
    if not _PG_REASON:
        _PG_REASON.append(_pg_unreachable_reason())
    if _PG_REASON[0]:
        pytest.skip(_PG_REASON[0])


class _Databases:
    """Makes throwaway warehouses of one dialect and removes them afterwards."""

    def __init__(self, dialect: str, tmp_dir: Path):
        self.dialect = dialect
        self.tmp_dir = tmp_dir
        self.made: list[tuple[SqlWarehouse, str]] = []

    def new(self) -> SqlWarehouse:
        name = f"bf_demo_test_{uuid.uuid4().hex[:10]}"
        if self.dialect == "sqlite":
            db = make_warehouse(f"sqlite:///{self.tmp_dir / (name + '.sqlite3')}")
        else:
            import psycopg

            with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
                admin.execute(f"CREATE DATABASE {name}")
            db = make_warehouse(PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + name)
        self.made.append((db, name))
        return db

    def cleanup(self) -> None:
        for db, name in self.made:
            db.close()
            if self.dialect == "postgresql":
                import psycopg

                with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
                    admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


DIALECTS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]


@pytest.fixture(params=DIALECTS)
def databases(request, tmp_path):
    if request.param == "postgresql":
        _require_pg()
    made = _Databases(request.param, tmp_path)
    yield made
    made.cleanup()


def _loaded(dialect: str, tmp_path_factory):
    if dialect == "postgresql":
        _require_pg()
    made = _Databases(dialect, tmp_path_factory.mktemp(f"demo_{dialect}"))
    db = made.new()
    load_demo_sources(db, **SMALL)
    return made, db


@pytest.fixture(scope="module")
def sqlite_loaded(tmp_path_factory):
    made, db = _loaded("sqlite", tmp_path_factory)
    yield db
    made.cleanup()


@pytest.fixture(scope="module")
def pg_loaded(tmp_path_factory):
    made, db = _loaded("postgresql", tmp_path_factory)
    yield db
    made.cleanup()


@pytest.fixture(params=DIALECTS)
def loaded_db(request):
    """A warehouse holding SMALL, shared by the module's read-only tests."""
    return request.getfixturevalue("sqlite_loaded" if request.param == "sqlite" else "pg_loaded")


# -- helpers ----------------------------------------------------------------------------
def _dump(db: SqlWarehouse) -> dict[str, list[tuple]]:
    return {
        table: db.query(f"SELECT * FROM {table} ORDER BY {order}")
        for table, order in (
            (ORDER_EVENTS, "event_id"),
            (PAGE_EVENTS, "event_id"),
            ("_bf_source_loads", "source, load_key"),  # the keyed loads (WarehouseBackend.load_source)
        )
    }


def _utc(value) -> datetime:
    if isinstance(value, datetime):
        return value.astimezone(timezone.utc)
    return datetime.strptime(value, "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc)


def _norm(value):
    """One comparable form for both dialects' values."""
    if isinstance(value, (float, Decimal)):
        return f"{float(value):.2f}"
    if isinstance(value, datetime):
        return value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    return value


def _norm_rows(rows) -> list[tuple]:
    return sorted((tuple(_norm(v) for v in row) for row in rows), key=repr)


def _count(db: SqlWarehouse, table: str) -> int:
    return db.query(f"SELECT COUNT(*) FROM {table}")[0][0]


# -- the render helper (a stand-in for the executor) ----------------------------------
def load_catalog() -> dict:
    return yaml.safe_load(CATALOG_PATH.read_text())


def _sql_type(db: SqlWarehouse, declared: str) -> str:
    if db.dialect == "sqlite":
        return {"text": "TEXT", "integer": "INTEGER", "numeric": "REAL", "timestamp": "TEXT",
                "date": "TEXT", "boolean": "INTEGER"}[declared]
    return {"text": "TEXT", "integer": "BIGINT", "numeric": "NUMERIC", "timestamp": "TIMESTAMPTZ",
            "date": "DATE", "boolean": "BOOLEAN"}[declared]


class Renderer:
    def __init__(self, db: SqlWarehouse, catalog: dict):
        self.db = db
        self.datasets = {d["name"]: d for d in catalog["datasets"]}
        self.jobs = {j["name"]: j for j in catalog["jobs"]}
        self.env = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False)
        self.tables: dict[tuple[str, str], str] = {}  # (dataset, partition_key) -> materialised table

    def render(self, sql: str, *, job: str, start: datetime, end: datetime, partition_key: str,
               previous_key: str | None = None, this: str | None = None) -> str:
        db = self.db

        def ref(name: str) -> str:
            dataset = self.datasets[name]
            if dataset.get("source"):
                column = dataset["time_column"]
                return (f"(SELECT * FROM {name} WHERE {column} >= {db.ts_literal(start)}"
                        f" AND {column} < {db.ts_literal(end)})")
            return f"(SELECT * FROM {self.tables[(name, partition_key)]})"

        def ref_previous() -> str:
            produced = self.jobs[job]["produces"]
            if previous_key is not None:
                return f"(SELECT * FROM {self.tables[(produced, previous_key)]})"
            columns = ", ".join(
                f"CAST(NULL AS {_sql_type(db, c['type'])}) AS {c['name']}" for c in self.datasets[produced]["columns"]
            )
            return f"(SELECT {columns} WHERE 1 = 0)"

        return self.env.from_string(sql).render(
            data_interval_start=db.ts_literal(start),
            data_interval_end=db.ts_literal(end),
            partition_key="'" + partition_key.replace("'", "''") + "'",
            ref=ref,
            ref_previous=ref_previous,
            this=this,
        )

    def output_columns(self, rendered: str) -> list[str]:
        return self.db.columns_of(rendered)

    def materialise(self, job: str, *, start: datetime, end: datetime, partition_key: str,
                    previous_key: str | None = None) -> str:
        """Run the job's template for one interval into a fresh table; return its name."""
        db = self.db
        definition = self.jobs[job]
        dataset = self.datasets[definition["produces"]]
        rendered = self.render(definition["sql"], job=job, start=start, end=end,
                               partition_key=partition_key, previous_key=previous_key)
        declared = [c["name"] for c in dataset["columns"]]
        assert sorted(self.output_columns(rendered)) == sorted(declared), job
        table = f"t_{job}_{re.sub(r'[^0-9a-z]', '_', partition_key.lower())}"
        db.execute(f"DROP TABLE IF EXISTS {table}")
        db.execute(f"CREATE TABLE {table} ("
                   + ", ".join(f"{c['name']} {_sql_type(db, c['type'])}" for c in dataset["columns"]) + ")")
        columns = ", ".join(declared)
        db.execute(f"INSERT INTO {table} ({columns}) SELECT {columns} FROM ({rendered}) AS q")
        self.tables[(dataset["name"], partition_key)] = table
        return table

    def run_checks(self, dataset_name: str, table: str) -> dict[str, int]:
        failures = {}
        for check in self.datasets[dataset_name].get("checks", []):
            rendered = self.env.from_string(check["sql"]).render(this=table)
            failures[check["name"]] = len(self.db.query(rendered))
        return failures


def _build_daily(db: SqlWarehouse, catalog: dict) -> Renderer:
    """Materialise every daily SQL job for DAYS, upstream first, in day order."""
    renderer = Renderer(db, catalog)
    previous = None
    for day in DAYS:
        start, end = local_day_bounds(day, ZoneInfo("Asia/Shanghai"))
        for job in DAILY_JOBS:
            renderer.materialise(job, start=start, end=end, partition_key=day.isoformat(),
                                 previous_key=previous if renderer.jobs[job].get("depends_on_past") else None)
        previous = day.isoformat()
    return renderer


@pytest.fixture(scope="module")
def sqlite_built(sqlite_loaded):
    return _build_daily(sqlite_loaded, load_catalog())


@pytest.fixture(scope="module")
def pg_built(pg_loaded):
    return _build_daily(pg_loaded, load_catalog())


@pytest.fixture(params=DIALECTS)
def built(request) -> Renderer:
    return request.getfixturevalue("sqlite_built" if request.param == "sqlite" else "pg_built")


# -- the generator ----------------------------------------------------------------------
def test_same_seed_gives_identical_rows_and_another_seed_does_not(databases):
    first, second, other = databases.new(), databases.new(), databases.new()
    counts = load_demo_sources(first, **SMALL)
    assert load_demo_sources(second, **SMALL) == counts
    assert _dump(first) == _dump(second)
    load_demo_sources(other, **{**SMALL, "seed": 8})
    assert _dump(other)[ORDER_EVENTS] != _dump(first)[ORDER_EVENTS]


def test_second_call_inserts_nothing(databases):
    db = databases.new()
    counts = load_demo_sources(db, **SMALL)
    assert counts[ORDER_EVENTS] > 1000 and counts[PAGE_EVENTS] > 1000
    assert counts == {ORDER_EVENTS: _count(db, ORDER_EVENTS), PAGE_EVENTS: _count(db, PAGE_EVENTS)}
    assert load_demo_sources(db, **SMALL) == {ORDER_EVENTS: 0, PAGE_EVENTS: 0}
    assert counts == {ORDER_EVENTS: _count(db, ORDER_EVENTS), PAGE_EVENTS: _count(db, PAGE_EVENTS)}


def test_a_wider_range_adds_only_the_missing_days_and_a_day_does_not_depend_on_the_range(databases):
    partial, full = databases.new(), databases.new()
    middle = load_demo_sources(partial, **{**SMALL, "first": DAYS[1], "last": DAYS[1]})
    rest = load_demo_sources(partial, **SMALL)
    everything = load_demo_sources(full, **SMALL)
    assert {k: middle[k] + rest[k] for k in middle} == everything
    assert _dump(partial) == _dump(full)


def test_order_events_have_null_keys_versions_and_late_arrivals(loaded_db):
    rows = loaded_db.query_dicts(f"SELECT * FROM {ORDER_EVENTS}")
    assert len({r["event_id"] for r in rows}) == len(rows)
    null_items = [r for r in rows if r["item_id"] is None]
    assert 0 < len(null_items) < 0.02 * len(rows)

    versions = Counter((r["order_id"], r["item_id"]) for r in rows if r["item_id"] is not None)
    assert max(versions.values()) == 3
    assert sum(1 for n in versions.values() if n > 1) > 0.3 * len(versions)

    late = [r for r in rows if _utc(r["ingested_at"]) - _utc(r["event_time"]) >= timedelta(days=1)]
    assert 0.005 * len(rows) < len(late) < 0.05 * len(rows)
    assert all(_utc(r["ingested_at"]) - _utc(r["event_time"]) <= timedelta(days=6) for r in rows)

    assert {r["status"] for r in rows} == {"created", "paid", "shipped", "refunded"}
    assert len({r["category"] for r in rows}) == 8
    assert all(Decimal(str(r["amount"])) == round(Decimal(str(r["amount"])), 2) > 0 for r in rows)
    # Every event falls inside the loaded Shanghai business days; an order never
    # spans two days and keeps one customer and one category.
    start, _ = local_day_bounds(DAYS[0], ZoneInfo("Asia/Shanghai"))
    _, end = local_day_bounds(DAYS[-1], ZoneInfo("Asia/Shanghai"))
    assert all(start <= _utc(r["event_time"]) < end for r in rows)
    per_order = defaultdict(set)
    for r in rows:
        day = _utc(r["event_time"]).astimezone(ZoneInfo("Asia/Shanghai")).date()
        per_order[r["order_id"]].add((day, r["customer_id"], r["category"]))
    assert all(len(v) == 1 for v in per_order.values())


def test_orders_peak_in_the_shanghai_evening(loaded_db):
    hours = Counter(
        _utc(t).astimezone(ZoneInfo("Asia/Shanghai")).hour
        for (t,) in loaded_db.query(f"SELECT event_time FROM {ORDER_EVENTS}")
    )
    assert sum(hours[h] for h in (20, 21, 22)) > 4 * sum(hours[h] for h in (3, 4, 5))


def test_page_events_follow_new_york_hours_through_the_dst_change(loaded_db):
    new_york = ZoneInfo("America/New_York")
    start, end = local_day_bounds(date(2022, 11, 6), new_york)
    assert end - start == timedelta(hours=25)
    times = [_utc(t) for (t,) in loaded_db.query(
        f"SELECT event_time FROM {PAGE_EVENTS} WHERE event_time >= ? AND event_time < ?",
        (loaded_db.ts(start), loaded_db.ts(end)),
    )]
    utc_hours = Counter(t.replace(minute=0, second=0) for t in times)
    assert len(utc_hours) == 25  # the repeated 01:00 hour has its own traffic
    local = Counter(t.astimezone(new_york).hour for t in times)
    assert sum(local[h] for h in (19, 20, 21)) > 3 * sum(local[h] for h in (3, 4, 5))


def test_the_loaded_timestamps_are_exactly_what_db_ts_stores(loaded_db):
    """The generator's instants go through the seam's Arrow path: what is stored is the
    engine's own `ts()` of each instant (tests/backends/test_sources.py on every backend)."""
    for (stored,) in loaded_db.query(f"SELECT event_time FROM {ORDER_EVENTS} ORDER BY event_id LIMIT 50"):
        assert loaded_db.ts(_utc(stored)) == stored


def test_generation_in_a_child_process_gives_the_same_rows(tmp_path, monkeypatch):
    used = []

    class RecordingPool(demo_data.ProcessPoolExecutor):
        def __init__(self, *args, **kwargs):
            used.append(kwargs)
            super().__init__(*args, **kwargs)

    small = {**SMALL, "orders_per_day": 30, "page_views_per_hour": 4}
    serial = make_warehouse(f"sqlite:///{tmp_path / 'serial.sqlite3'}")
    monkeypatch.setattr(demo_data, "PARALLEL_MIN_DAYS", 1000)
    load_demo_sources(serial, **small)
    assert not used

    parallel = make_warehouse(f"sqlite:///{tmp_path / 'parallel.sqlite3'}")
    monkeypatch.setattr(demo_data, "PARALLEL_MIN_DAYS", 1)
    monkeypatch.setattr(demo_data, "ProcessPoolExecutor", RecordingPool)
    monkeypatch.setattr(demo_data.threading, "active_count", lambda: 1)  # a plugin's thread is harmless here
    load_demo_sources(parallel, **small)
    assert used, "the child-process path was not taken"
    assert _dump(parallel) == _dump(serial)


def test_correct_source_day_adds_new_versions_once(databases):
    db = databases.new()
    load_demo_sources(db, **SMALL)
    now = datetime(2023, 1, 15, 9, 30, tzinfo=timezone.utc)
    before = _count(db, ORDER_EVENTS)
    added = correct_source_day(db, day=DAYS[1], factor_category="apparel", seed=1, now=now)
    assert 0 < added <= 8
    assert _count(db, ORDER_EVENTS) == before + added
    assert correct_source_day(db, day=DAYS[1], factor_category="apparel", seed=1, now=now) == 0

    corrections = db.query_dicts(f"SELECT * FROM {ORDER_EVENTS} WHERE event_id LIKE 'corr-%'")
    assert len(corrections) == added
    start, end = local_day_bounds(DAYS[1], ZoneInfo("Asia/Shanghai"))
    assert all(start <= _utc(r["event_time"]) < end and r["category"] == "apparel" for r in corrections)
    assert all(_utc(r["ingested_at"]) == _utc(r["updated_at"]) == now for r in corrections)

    # The corrections are now the latest versions, with changed amounts: the day's
    # dwd partition changes when recomputed.
    renderer = Renderer(db, load_catalog())
    table = renderer.materialise("dwd_order_items", start=start, end=end, partition_key=DAYS[1].isoformat())
    latest = {(r[0], r[1]): r[2] for r in db.query(f"SELECT order_id, item_id, amount FROM {table}")}
    for r in corrections:
        assert float(latest[(r["order_id"], r["item_id"])]) == pytest.approx(float(r["amount"]))
    previous = {
        (r[0], r[1]): r[2]
        for r in db.query(f"SELECT order_id, item_id, amount FROM {ORDER_EVENTS} WHERE event_id NOT LIKE 'corr-%'"
                          f" AND category = 'apparel' ORDER BY updated_at, event_id")
    }
    assert all(float(r["amount"]) != float(previous[(r["order_id"], r["item_id"])]) for r in corrections)

    assert correct_source_day(db, day=DAYS[1], factor_category="apparel", seed=2, now=now) > 0


# -- the catalog --------------------------------------------------------------------------
def test_demo_catalog_is_consistent():
    catalog = load_catalog()
    assert catalog["version"] == 1
    teams = {t["name"] for t in catalog["teams"]}
    assert teams == {"ingestion", "core-data", "analytics", "finance"}
    assert catalog["pools"] == [{"name": "warehouse", "slots": 8, "reserved_for_production": 2}]
    datasets = {d["name"]: d for d in catalog["datasets"]}
    jobs = {j["name"]: j for j in catalog["jobs"]}

    for d in datasets.values():
        ZoneInfo(d["timezone"])
        assert d["owner"] in DEMO_USERS and d["team"] in teams
        assert d["grain"] in {"hour", "day", "month"}
        names = [c["name"] for c in d["columns"]]
        assert len(names) == len(set(names))
        assert all(c["type"] in COLUMN_TYPES for c in d["columns"])
        assert set(d["business_key"]) <= set(names)
        assert d.get("core_measure") in (None, *names)
        if d.get("source"):
            assert d["time_column"] in names and d["name"] not in jobs
        else:
            assert jobs[d["name"]]["produces"] == d["name"]  # one job per dataset, same name
        for check in d.get("checks", []):
            assert {"name", "blocking", "sql"} <= set(check) and "{{ this }}" in check["sql"]

    forbidden = re.compile(r"\b(now|random|current_date|current_timestamp|localtimestamp|datetime|julianday)\b", re.I)
    for j in jobs.values():
        assert set(j["reads"]) <= set(datasets) and j["pool"] == "warehouse"
        assert j["kind"] in {"sql", "python", "side_effect"}
        if j["kind"] == "sql":
            assert not forbidden.search(j["sql"]), j["name"]
            for name in re.findall(r"ref\('([^']+)'\)", j["sql"]):
                assert name in j["reads"], (j["name"], name)
            assert ("ref_previous()" in j["sql"]) == bool(j.get("depends_on_past"))
    assert jobs["notify_finance"]["kind"] == "side_effect"
    assert jobs["notify_finance"]["side_effect"]["channel"] == "finance-email"
    assert {n for n, j in jobs.items() if j.get("scheduled")} == {"dwd_order_items", "dwd_page_views_hourly"}
    assert datasets["dwd_page_views_hourly"]["timezone"] == "America/New_York"


def test_dwd_order_items_keeps_exactly_the_latest_version_of_each_item(built):
    db = built.db
    for day in DAYS:
        table = built.tables[("dwd_order_items", day.isoformat())]
        rows = db.query_dicts(f"SELECT * FROM {table}")
        keys = [(r["order_id"], r["item_id"]) for r in rows]
        assert len(keys) == len(set(keys)) > 0
        assert all(r["item_id"] is not None for r in rows)

        start, end = local_day_bounds(day, ZoneInfo("Asia/Shanghai"))
        latest: dict = {}
        for e in db.query_dicts(f"SELECT * FROM {ORDER_EVENTS} WHERE event_time >= ? AND event_time < ?",
                                (db.ts(start), db.ts(end))):
            key = (e["order_id"], e["item_id"])
            if e["item_id"] is not None and (key not in latest or
                                             (_utc(e["updated_at"]), e["event_id"]) > (_utc(latest[key]["updated_at"]), latest[key]["event_id"])):
                latest[key] = e
        columns = [c["name"] for c in built.datasets["dwd_order_items"]["columns"]]
        assert _norm_rows([tuple(r[c] for c in columns) for r in rows]) == \
            _norm_rows([tuple(e[c] for c in columns) for e in latest.values()])
        assert any(e["status"] != "created" for e in latest.values())
        assert all(n == 0 for n in built.run_checks("dwd_order_items", table).values())


def test_sales_and_report_totals_agree_with_the_order_items(built):
    db = built.db
    for day in DAYS:
        key = day.isoformat()
        dwd, dws, ads = (built.tables[(name, key)] for name in ("dwd_order_items", "dws_sales_daily", "ads_gmv_report"))
        (items, orders, gmv), = db.query(
            f"SELECT COUNT(*), COUNT(DISTINCT order_id),"
            f" SUM(CASE WHEN status <> 'refunded' THEN amount ELSE 0 END) FROM {dwd}")
        sales = db.query_dicts(f"SELECT * FROM {dws}")
        assert {r["ds"] for r in sales} == {key} and len(sales) == 8
        assert sum(r["items"] for r in sales) == items
        assert sum(r["orders"] for r in sales) == orders
        assert float(sum(Decimal(str(r["gmv"])) for r in sales)) == pytest.approx(float(gmv), abs=0.01)
        report = db.query_dicts(f"SELECT * FROM {ads}")
        assert len(report) == 1 and report[0]["ds"] == key
        assert report[0]["orders"] == orders
        assert Decimal(str(report[0]["gmv"])) == sum(Decimal(str(r["gmv"])) for r in sales)
        for name, table in (("dws_sales_daily", dws), ("ads_gmv_report", ads)):
            assert all(n == 0 for n in built.run_checks(name, table).values()), name


def test_customer_cumulative_carries_the_previous_partition_forward(built):
    db = built.db
    totals: dict[str, list] = defaultdict(lambda: [0, Decimal("0")])
    for day in DAYS:
        dwd = built.tables[("dwd_order_items", day.isoformat())]
        for customer, orders, gmv in db.query(
            f"SELECT customer_id, COUNT(DISTINCT order_id),"
            f" SUM(CASE WHEN status <> 'refunded' THEN amount ELSE 0 END) FROM {dwd} GROUP BY customer_id"
        ):
            totals[customer][0] += orders
            totals[customer][1] += Decimal(str(gmv))
        table = built.tables[("dws_customer_cumulative", day.isoformat())]
        rows = db.query_dicts(f"SELECT * FROM {table}")
        assert len(rows) == len({r["customer_id"] for r in rows}) == len(totals)
        for r in rows:
            orders, gmv = totals[r["customer_id"]]
            assert r["ds"] == day.isoformat() and r["orders_to_date"] == orders
            assert float(r["gmv_to_date"]) == pytest.approx(float(gmv), abs=0.011)
        assert all(n == 0 for n in built.run_checks("dws_customer_cumulative", table).values())
    assert any(orders > 1 for orders, _ in totals.values())  # repeat customers accumulate


def test_running_a_template_twice_gives_identical_rows(built):
    db = built.db
    day = DAYS[1]
    start, end = local_day_bounds(day, ZoneInfo("Asia/Shanghai"))
    for job in DAILY_JOBS:
        rendered = built.render(built.jobs[job]["sql"], job=job, start=start, end=end,
                                partition_key=day.isoformat(), previous_key=DAYS[0].isoformat())
        first, second = db.query(rendered), db.query(rendered)
        assert first and sorted(first, key=repr) == sorted(second, key=repr), job


def test_hourly_page_views_cover_every_new_york_hour_including_the_repeated_one(loaded_db):
    db = loaded_db
    renderer = Renderer(db, load_catalog())
    new_york = ZoneInfo("America/New_York")
    day_start, day_end = local_day_bounds(date(2022, 11, 6), new_york)
    keys, total = set(), 0
    start = day_start
    while start < day_end:
        end = start + timedelta(hours=1)
        key = start.astimezone(new_york).isoformat(timespec="minutes")  # e.g. 2022-11-06T01:00-04:00
        table = renderer.materialise("dwd_page_views_hourly", start=start, end=end, partition_key=key)
        rows = db.query_dicts(f"SELECT * FROM {table}")
        assert rows and {r["hour"] for r in rows} == {key}
        assert all(n == 0 for n in renderer.run_checks("dwd_page_views_hourly", table).values())
        total += sum(r["views"] for r in rows)
        keys.add(key)
        start = end
    assert len(keys) == 25
    assert {"2022-11-06T01:00-04:00", "2022-11-06T01:00-05:00"} <= keys
    (source_total,), = db.query(f"SELECT COUNT(*) FROM {PAGE_EVENTS} WHERE event_time >= ? AND event_time < ?",
                                (db.ts(day_start), db.ts(day_end)))
    assert total == source_total


@pytest.mark.postgres
def test_sqlite_and_postgresql_compute_the_same_results(sqlite_built, request):
    _require_pg()
    pg_built = request.getfixturevalue("pg_built")
    assert _norm_rows(sqlite_built.db.query(f"SELECT * FROM {ORDER_EVENTS}")) == \
        _norm_rows(pg_built.db.query(f"SELECT * FROM {ORDER_EVENTS}"))
    for (dataset, key), table in sqlite_built.tables.items():
        columns = ", ".join(c["name"] for c in sqlite_built.datasets[dataset]["columns"])
        on_sqlite = sqlite_built.db.query(f"SELECT {columns} FROM {table}")
        on_pg = pg_built.db.query(f"SELECT {columns} FROM {pg_built.tables[(dataset, key)]}")
        assert _norm_rows(on_sqlite) == _norm_rows(on_pg), (dataset, key)
