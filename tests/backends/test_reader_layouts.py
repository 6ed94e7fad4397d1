"""PostgreSQL's two reader layouts (backends.READER_LAYOUTS): "partitioned" (each
published version attached to the reader table) and "table" (one plain table whose
partition a publish replaces), the catalog's choice of them (an hourly dataset gets a
table) and the conversion between them. What holds in either layout is proven by the
contract suite, which runs on both (test_contract.py, `postgresql-table`)."""
from __future__ import annotations

import threading
from dataclasses import replace

import psycopg
import pytest

from backfill_portal.backends import check_warehouse_url, make_warehouse
from backfill_portal.core.errors import ValidationError
from tests.backends.test_contract import DAY, NEXT_DAY, ORDERS, order_rows, stage
from tests.backends.test_layout import DAILY, daily_rows, indexed_columns, relation_kind

pytestmark = pytest.mark.postgres

TABLE = replace(DAILY, reader_layout="table")
PARTITIONED = replace(DAILY, reader_layout="partitioned")
THIRD_DAY = "2024-03-03"


@pytest.fixture
def pg(pg_url):
    with psycopg.connect(pg_url, autocommit=True) as conn:  # a clean schema per test
        conn.execute("DROP SCHEMA public CASCADE")
        conn.execute("CREATE SCHEMA public")
    warehouse = make_warehouse(pg_url)
    yield warehouse
    warehouse.close()


def grant_to_a_reader(wh) -> None:
    """Readers' role gets SELECT on the reader table, as docs/deploy.md says to."""
    wh.execute("DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'bf_test_reader') "
               "THEN CREATE ROLE bf_test_reader; END IF; END $$")
    wh.execute(f'GRANT SELECT ON "{DAILY.name}" TO bf_test_reader')


def reader_may_select(wh) -> bool:
    return wh.query(f"SELECT has_table_privilege('bf_test_reader', '\"{DAILY.name}\"', 'SELECT')")[0][0]


def published(wh, spec, partition):
    return wh.query(f'SELECT COUNT(*), SUM("amount") FROM "{spec.name}" WHERE "ds" = ?', (partition,))[0]


def stage_daily(wh, spec, run_id, partition=DAY, n=5, seed=0):
    return wh.stage_rows(spec=spec, run_id=run_id, attempt_no=1, partition=partition,
                         rows=daily_rows(n, partition, seed=seed))


def test_the_table_layout_is_one_plain_table_of_the_published_rows_and_their_indexes(pg):
    stage_daily(pg, TABLE, "run-1", n=6)
    stage_daily(pg, TABLE, "run-2", n=4, seed=1)
    stage_daily(pg, TABLE, "run-3", partition=NEXT_DAY, n=3)
    pg.publish(spec_or_name=TABLE, partition=DAY, run_id="run-1", expected_run_id=None, actor="owner")
    pg.publish(spec_or_name=TABLE, partition=NEXT_DAY, run_id="run-3", expected_run_id=None, actor="owner")
    pg.publish(spec_or_name=TABLE, partition=DAY, run_id="run-2", expected_run_id="run-1", actor="owner")

    assert relation_kind(pg, DAILY.name) == "table"
    # What a plain table of the data would store: no run, no second copy of the key.
    assert pg.columns_of(f'SELECT * FROM "{DAILY.name}"') == list(DAILY.column_names)
    assert published(pg, TABLE, DAY)[0] == 4 and published(pg, TABLE, NEXT_DAY)[0] == 3
    assert {r["_run_id"] for r in pg.read_partition(DAILY.name, DAY)} == {"run-2"}
    # The partition key's index (what a publish replaces a partition by) and the declared ones;
    # the versions have none (readers do not read them).
    assert {("ds",), ("customer",), ("day", "customer")} <= set(indexed_columns(pg, DAILY.name))
    assert indexed_columns(pg, pg.version_table(TABLE, "run-1")) == []

    pg.rollback(name=DAILY.name, partition=DAY, to_run_id="run-1", expected_run_id="run-2", actor="oncall")
    assert published(pg, TABLE, DAY)[0] == 6
    assert {r["_run_id"] for r in pg.read_partition(DAILY.name, DAY)} == {"run-1"}
    # Downstream runs read their pins, not the reader table.
    pinned = pg.ref_sql(spec=TABLE, pins={DAY: "run-2"})
    assert pg.query(f"SELECT COUNT(*) FROM {pinned} AS p")[0][0] == 4


def test_without_a_partition_column_the_table_layout_stores_the_key_in_partition(pg):
    spec = replace(ORDERS, reader_layout="table")
    stage(pg, "run-1", order_rows(5), spec=spec)
    pg.publish(spec_or_name=spec, partition=DAY, run_id="run-1", expected_run_id=None, actor="owner")

    assert pg.columns_of('SELECT * FROM "orders"') == [*ORDERS.column_names, "_partition"]
    assert pg.query('SELECT DISTINCT "_partition" FROM "orders"') == [(DAY,)]
    assert ("_partition",) in indexed_columns(pg, "orders")


def test_a_publish_on_the_table_layout_does_not_wait_for_a_long_reader_who_keeps_its_snapshot(pg, pg_url):
    """A reader holding its snapshot (and its lock on the reader table) does not delay
    a publish, nor see it; readers meanwhile see the old partition or the new one,
    whole, never an empty or a mixed one."""
    stage_daily(pg, TABLE, "run-1", n=30)
    stage_daily(pg, TABLE, "run-2", n=12, seed=1)
    pg.publish(spec_or_name=TABLE, partition=DAY, run_id="run-1", expected_run_id=None, actor="owner")
    seen: set[int] = set()
    stop, reading = threading.Event(), threading.Event()

    def read_all_the_time():
        with psycopg.connect(pg_url, autocommit=True) as conn:
            while not stop.is_set():
                seen.add(conn.execute('SELECT COUNT(*) FROM "daily_orders" WHERE "ds" = %s', (DAY,)).fetchone()[0])
                reading.set()

    with psycopg.connect(pg_url) as long_reader:
        long_reader.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        assert long_reader.execute('SELECT COUNT(*) FROM "daily_orders"').fetchone()[0] == 30
        reader = threading.Thread(target=read_all_the_time)
        reader.start()
        # Under load the publishes could all end before the reader's first query (it saw
        # nothing, and the test failed on an empty set): they start once it reads.
        assert reading.wait(30)
        try:
            previous = "run-1"
            for run_id in ("run-2", "run-1", "run-2"):  # publish, roll back, publish again
                if run_id == "run-1":
                    pg.rollback(name=DAILY.name, partition=DAY, to_run_id=run_id, expected_run_id=previous,
                                actor="oncall")
                else:
                    pg.publish(spec_or_name=TABLE, partition=DAY, run_id=run_id, expected_run_id=previous,
                               actor="owner")
                previous = run_id
        finally:
            stop.set()
            reader.join(timeout=30)
        # The publishes did not wait for it (a DETACH would have: ACCESS EXCLUSIVE), and its
        # snapshot still shows what it first read.
        assert long_reader.execute('SELECT COUNT(*) FROM "daily_orders"').fetchone()[0] == 30
    assert seen <= {30, 12} and seen
    assert published(pg, TABLE, DAY)[0] == 12


@pytest.mark.parametrize("start, then", [("partitioned", "table"), ("table", "partitioned")])
def test_the_upgrade_converts_between_the_layouts_keeping_versions_pointers_and_history(pg, start, then):
    first = replace(DAILY, reader_layout=start)
    stage_daily(pg, first, "run-1", n=6)
    stage_daily(pg, first, "run-2", n=4, seed=1)
    stage_daily(pg, first, "run-3", partition=NEXT_DAY, n=3)
    stage_daily(pg, first, "run-unpublished", partition=NEXT_DAY, n=9)
    pg.publish(spec_or_name=first, partition=DAY, run_id="run-1", expected_run_id=None, actor="owner")
    pg.publish(spec_or_name=first, partition=DAY, run_id="run-2", expected_run_id="run-1", actor="owner")
    pg.publish(spec_or_name=first, partition=NEXT_DAY, run_id="run-3", expected_run_id=None, actor="owner")
    before = sorted(pg.query('SELECT "customer", "amount", "ds" FROM "daily_orders"'))
    history = pg.history(DAILY.name, DAY)
    grant_to_a_reader(pg)

    converted = make_warehouse(pg.url)  # a process that reads the new catalog
    second = replace(DAILY, reader_layout=then)
    done = converted.upgrade_layout(second)

    assert done == {"versions": 4, "published": 2, "layout": then}
    assert relation_kind(converted, DAILY.name) == ("partitioned table" if then == "partitioned" else "table")
    assert sorted(converted.query('SELECT "customer", "amount", "ds" FROM "daily_orders"')) == before
    assert converted.history(DAILY.name, DAY) == history
    assert reader_may_select(converted)  # the table made again keeps the readers' grant
    assert converted.upgrade_layout(second) == {}  # idempotent
    # The versions are all still there: one unpublished, one to roll back to.
    converted.ensure_dataset(second)
    converted.rollback(name=DAILY.name, partition=DAY, to_run_id="run-1", expected_run_id="run-2", actor="oncall")
    assert published(converted, second, DAY)[0] == 6
    converted.publish(spec_or_name=second, partition=NEXT_DAY, run_id="run-unpublished", expected_run_id="run-3",
                      actor="owner")
    assert published(converted, second, NEXT_DAY)[0] == 9
    if then == "partitioned":  # an attached version has what readers' filters need
        assert {("customer",), ("day", "customer")} <= set(
            indexed_columns(converted, converted.version_table(second, "run-3")))
    converted.close()


def test_an_existing_reader_table_keeps_its_layout_until_it_is_converted(pg):
    """A catalog that now names the other layout does not move a dataset behind the
    operator's back: staging and publishing go on in the layout it has."""
    stage_daily(pg, PARTITIONED, "run-1")
    pg.publish(spec_or_name=PARTITIONED, partition=DAY, run_id="run-1", expected_run_id=None, actor="owner")
    later = make_warehouse(pg.url)
    stage_daily(later, TABLE, "run-2", seed=1)
    later.publish(spec_or_name=TABLE, partition=DAY, run_id="run-2", expected_run_id="run-1", actor="owner")
    assert relation_kind(later, DAILY.name) == "partitioned table"
    assert {r["_run_id"] for r in later.read_partition(DAILY.name, DAY)} == {"run-2"}
    later.close()


def test_the_url_names_the_default_layout_and_a_wrong_one_is_refused_in_one_line(pg_url):
    table = make_warehouse(f"{pg_url}?reader_layout=table")
    assert table.default_layout == "table" and make_warehouse(pg_url).default_layout == "partitioned"
    table.probe()  # the option is the portal's, not handed to libpq
    assert check_warehouse_url(f"{pg_url}?reader_layout=table") is None
    message = check_warehouse_url(f"{pg_url}?reader_layout=heap")
    assert message and "reader_layout='heap'" in message and "\n" not in message
    with pytest.raises(ValidationError, match="partitioned, table"):
        make_warehouse(f"{pg_url}?reader_layout=heap")
    with pytest.raises(ValidationError, match="reader layout"):
        replace(DAILY, reader_layout="heap")


def test_converting_many_partitions_goes_a_batch_a_transaction_and_keeps_what_is_published_meanwhile(pg):
    """Partitioned to table, as an hourly dataset of thousands of partitions needs it:
    the new table is filled a batch of versions a transaction (each holds a lock on
    every version it reads), readers and publications go on meanwhile, and what was
    published during the copy is in the reader table after the switch."""
    for i, partition in enumerate((DAY, NEXT_DAY, THIRD_DAY)):
        stage_daily(pg, PARTITIONED, f"run-{i}", partition=partition, n=4 + i)
        pg.publish(spec_or_name=PARTITIONED, partition=partition, run_id=f"run-{i}", expected_run_id=None,
                   actor="owner")
    stage_daily(pg, PARTITIONED, "run-later", partition=DAY, n=11, seed=3)
    grant_to_a_reader(pg)
    publisher, converting = make_warehouse(pg.url), make_warehouse(pg.url)
    converting.conversion_batch = 1  # a transaction per version
    second_batch = f'FROM "{pg.version_table(DAILY, "run-1")}"'
    published_meanwhile = []

    def publish_during_the_second_batch(call, statement):
        if statement.startswith("INSERT") and second_batch in statement and not published_meanwhile:
            # The first batch (DAY) has committed; a publication of DAY goes through now.
            published_meanwhile.append(publisher.publish(
                spec_or_name=PARTITIONED, partition=DAY, run_id="run-later", expected_run_id="run-0", actor="owner"))
        return call()

    with converting.execute_wrapper(publish_during_the_second_batch):
        done = converting.upgrade_layout(TABLE)

    assert published_meanwhile and done == {"versions": 4, "published": 3, "layout": "table"}
    assert relation_kind(pg, DAILY.name) == "table" and reader_may_select(pg)
    assert [published(pg, TABLE, p)[0] for p in (DAY, NEXT_DAY, THIRD_DAY)] == [11, 5, 6]
    assert relation_kind(pg, f"{DAILY.name}__old") is None and relation_kind(pg, f"{DAILY.name}__bld") is None
    for run_id in ("run-0", "run-1", "run-2", "run-later"):  # every version keeps its table
        assert relation_kind(pg, pg.version_table(DAILY, run_id)) == "table"
    assert {("ds",), ("customer",), ("day", "customer")} <= set(indexed_columns(pg, DAILY.name))
    publisher.rollback(name=DAILY.name, partition=DAY, to_run_id="run-0", expected_run_id="run-later",
                       actor="oncall")
    assert published(pg, TABLE, DAY)[0] == 4
    publisher.close()
    converting.close()
