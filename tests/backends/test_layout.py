"""The warehouse layout of issue #15, on SQLite and PostgreSQL: a published dataset is
a real table to readers, holding exactly the published versions; its partition column
is a real column; the declared indexes are on the reader table and on every version;
the numbers are taken in the pass that writes the version. (The contract suite,
test_contract.py, proves what holds whatever the layout.)"""
from __future__ import annotations

import pytest

from backfill_portal.backends import ColumnSpec, DatasetSpec
from backfill_portal.core.errors import ValidationError
from tests.backends.test_contract import (  # noqa: F401 - fixtures
    DAY,
    NEXT_DAY,
    ORDERS,
    SQL_CONTRACT,
    as_tuples,
    order_rows,
    publish,
    stage,
    version_rows,
    warehouse_url,
    wh,
)


@pytest.fixture(params=SQL_CONTRACT)
def backend_url(request, tmp_path):
    """The SQL backends' layout (Iceberg's is tests/backends/test_iceberg.py)."""
    return warehouse_url(request, tmp_path)

# The partition key in a column of its own (`ds`), and two indexes readers need.
DAILY = DatasetSpec(
    name="daily_orders",
    columns=(*ORDERS.columns, ColumnSpec("ds", "text")),
    business_key=ORDERS.business_key,
    core_measure="amount",
    partition_column="ds",
    indexes=(("customer",), ("day", "customer")),
)


def daily_rows(n: int, partition: str = DAY, *, seed: int = 0) -> list[tuple]:
    return [row + (partition,) for row in order_rows(n, seed=seed)]


def relation_kind(wh, name: str) -> str | None:
    if wh.dialect == "postgresql":
        rows = wh.query("SELECT relkind FROM pg_class WHERE oid = to_regclass(?)", (f'"{name}"',))
        return {"p": "partitioned table", "r": "table", "v": "view"}[rows[0][0]] if rows else None
    rows = wh.query("SELECT type FROM sqlite_master WHERE name = ?", (name,))
    return rows[0][0] if rows else None


def indexed_columns(wh, table: str) -> list[tuple[str, ...]]:
    """The column lists of `table`'s plain indexes."""
    if wh.dialect == "postgresql":
        rows = wh.query(
            """SELECT ARRAY(SELECT a.attname::text FROM unnest(i.indkey::int2[]) WITH ORDINALITY AS k(n, o)
                            JOIN pg_attribute AS a ON a.attrelid = i.indrelid AND a.attnum = k.n ORDER BY k.o)
               FROM pg_index AS i WHERE i.indrelid = to_regclass(?)""", (f'"{table}"',))
        return sorted(tuple(r[0]) for r in rows)
    names = [r[0] for r in wh.query("SELECT name FROM pragma_index_list(?)", (table,))]
    return sorted(tuple(c for (c,) in wh.query("SELECT name FROM pragma_index_info(?) ORDER BY seqno", (n,)))
                  for n in names)


def test_readers_read_a_real_table_holding_exactly_the_published_versions(wh):
    stage(wh, "run-a", order_rows(30))
    stage(wh, "run-b", order_rows(20, seed=1))
    stage(wh, "run-next", order_rows(10, seed=2), partition=NEXT_DAY)
    columns = ", ".join(f'"{c}"' for c in ORDERS.column_names)

    def reader_rows() -> list[tuple]:
        return sorted(wh.query(f'SELECT {columns} FROM "orders"'), key=repr)

    assert relation_kind(wh, "orders") in ("table", "partitioned table")
    assert reader_rows() == []  # staged is not published
    publish(wh, "run-a", None)
    publish(wh, "run-next", None, partition=NEXT_DAY)
    assert reader_rows() == sorted(version_rows(wh, "run-a") + version_rows(wh, "run-next"), key=repr)
    publish(wh, "run-b", "run-a")
    assert reader_rows() == sorted(version_rows(wh, "run-b") + version_rows(wh, "run-next"), key=repr)
    wh.rollback(name="orders", partition=DAY, to_run_id="run-a", expected_run_id="run-b", actor="oncall")
    assert reader_rows() == sorted(version_rows(wh, "run-a") + version_rows(wh, "run-next"), key=repr)
    # The replaced version is still there, by pin.
    assert sorted(wh.query(f"SELECT * FROM {wh.ref_sql(spec=ORDERS, pins={DAY: 'run-b'})} AS v"), key=repr) == \
        version_rows(wh, "run-b")


def test_the_partition_column_is_a_real_column_readers_filter_on(wh):
    wh.stage_rows(spec=DAILY, run_id="run-1", attempt_no=1, partition=DAY, rows=daily_rows(30))
    wh.stage_rows(spec=DAILY, run_id="run-2", attempt_no=1, partition=NEXT_DAY, rows=daily_rows(12, NEXT_DAY))
    for run_id, partition in (("run-1", DAY), ("run-2", NEXT_DAY)):
        wh.publish(spec_or_name=DAILY, partition=partition, run_id=run_id, expected_run_id=None, actor="owner")

    counts = dict(wh.query('SELECT "ds", COUNT(*) FROM "daily_orders" GROUP BY "ds"'))

    assert counts == {DAY: 30, NEXT_DAY: 12}
    assert {r["ds"] for r in wh.read_partition("daily_orders", NEXT_DAY)} == {NEXT_DAY}


@pytest.mark.parametrize("how", ["rows", "select"])
def test_a_row_whose_partition_column_is_not_its_partition_is_refused_and_nothing_is_written(wh, how):
    rows = daily_rows(10)
    rows[4] = rows[4][:-1] + (NEXT_DAY,)
    with pytest.raises(ValidationError) as refused:
        if how == "rows":
            wh.stage_rows(spec=DAILY, run_id="run-bad", attempt_no=1, partition=DAY, rows=rows)
        else:
            wh.stage_rows(spec=DAILY, run_id="run-src", attempt_no=1, partition=NEXT_DAY,
                          rows=daily_rows(3, NEXT_DAY))
            source = wh.ref_sql(spec=DAILY, pins={NEXT_DAY: "run-src"})
            wh.stage_select(spec=DAILY, run_id="run-bad", attempt_no=1, partition=DAY,
                            select_sql=f"SELECT * FROM {source} AS s")
    assert "partition_column" in refused.value.fields
    assert wh.marker("run-bad") is None


def one_table(wh) -> bool:
    """Whether readers read one table holding every partition (SQLite's current table,
    PostgreSQL's "table" layout) rather than the attached version tables."""
    return getattr(wh, "default_layout", "table") == "table"


def test_declared_indexes_are_on_the_reader_table_and_on_every_version(wh):
    for i, partition in enumerate((DAY, DAY, NEXT_DAY)):
        wh.stage_rows(spec=DAILY, run_id=f"run-{i}", attempt_no=1, partition=partition,
                      rows=daily_rows(5, partition, seed=i))
    wh.publish(spec_or_name=DAILY, partition=DAY, run_id="run-0", expected_run_id=None, actor="owner")
    wh.publish(spec_or_name=DAILY, partition=DAY, run_id="run-1", expected_run_id="run-0", actor="owner")

    on_reader = indexed_columns(wh, "daily_orders")
    assert {("customer",), ("day", "customer")} <= set(on_reader)
    if one_table(wh):  # one table holds every partition: a filter on `ds` needs its index
        assert ("ds",) in on_reader
    else:  # each version is a table of its own, attached or not
        for run_id in ("run-0", "run-1", "run-2"):
            assert {("customer",), ("day", "customer")} <= set(indexed_columns(wh, wh.version_table(DAILY, run_id)))

    # An index declared later reaches the reader table and the versions, attached or not.
    more = DatasetSpec(name=DAILY.name, columns=DAILY.columns, business_key=DAILY.business_key,
                       core_measure="amount", partition_column="ds", indexes=(*DAILY.indexes, ("paid",)))
    wh.ensure_dataset(more)
    assert ("paid",) in indexed_columns(wh, "daily_orders")
    if not one_table(wh):
        for run_id in ("run-0", "run-1", "run-2"):
            assert ("paid",) in indexed_columns(wh, wh.version_table(DAILY, run_id))
    wh.rollback(name=DAILY.name, partition=DAY, to_run_id="run-0", expected_run_id="run-1", actor="oncall")
    assert {r["_run_id"] for r in wh.read_partition(DAILY.name, DAY)} == {"run-0"}


def test_a_version_staged_before_a_column_was_added_can_be_shown_again(wh):
    stage(wh, "run-old", order_rows(5))
    publish(wh, "run-old", None)
    widened = DatasetSpec(name="orders", columns=ORDERS.columns + (ColumnSpec("channel", "text"),),
                          business_key=ORDERS.business_key, core_measure="amount")
    wh.ensure_dataset(widened)
    wh.stage_rows(spec=widened, run_id="run-new", attempt_no=1, partition=DAY,
                  rows=[r + ("web",) for r in order_rows(5, seed=1)])
    publish(wh, "run-new", "run-old")

    wh.rollback(name="orders", partition=DAY, to_run_id="run-old", expected_run_id="run-new", actor="oncall")

    seen = wh.read_partition("orders", DAY)
    assert {r["channel"] for r in seen} == {None} and as_tuples(seen) == version_rows(wh, "run-old")
    pinned = wh.query(f'SELECT "channel" FROM {wh.ref_sql(spec=widened, pins={DAY: "run-new"})} AS v')
    assert {c for (c,) in pinned} == {"web"}


def test_stage_select_takes_the_numbers_in_one_pass_over_the_rows_it_wrote(wh):
    source = stage(wh, "run-src", order_rows(60) + [order_rows(1)[0]])  # one duplicate key
    statements: list[str] = []

    def observe(call, statement):
        statements.append(statement)
        return call()

    table = wh.version_table(ORDERS, "run-copy")
    with wh.execute_wrapper(observe):
        marker = wh.stage_select(spec=ORDERS, run_id="run-copy", attempt_no=1, partition=DAY,
                                 select_sql=f"SELECT * FROM {wh.ref_sql(spec=ORDERS, pins={DAY: 'run-src'})} AS s")

    assert (marker.row_count, marker.distinct_keys, marker.null_keys) == (61, 60, 0)
    assert marker.fingerprint == source.fingerprint
    assert marker.measure_sum == pytest.approx(float(sum(r[3] for r in order_rows(60)) + order_rows(1)[0][3]))
    # The rows are written once: INSERT ... SELECT into the versions table (SQLite), or
    # CREATE TABLE ... AS SELECT making the version's own table (PostgreSQL).
    writes = [i for i, s in enumerate(statements)
              if f'INSERT INTO "{table}"' in s or f'CREATE TABLE "{table}" AS' in s]
    reads = [s for s in statements[writes[-1] + 1:] if f'"{table}"' in s and "SELECT" in s
             and not s.lstrip().upper().startswith("CREATE")]
    assert len(writes) == 1
    # The numbers and the fingerprint, read back in two statements: on PostgreSQL a scan
    # the server may run in parallel (rows, NULL keys, measure, row hashes) and the
    # distinct keys' sort; SQLite, which has no hash function, groups the rows by key
    # for the numbers and sorts them for its fingerprint.
    assert len(reads) == 2, reads


def test_a_staged_version_never_changes_the_reader_table(wh):
    stage(wh, "run-a", order_rows(10))
    publish(wh, "run-a", None)
    before = sorted(wh.query('SELECT * FROM "orders"'), key=repr)

    stage(wh, "run-b", order_rows(40, seed=3))
    with pytest.raises(RuntimeError):
        def failing():
            yield from order_rows(5, seed=4)
            raise RuntimeError("worker lost")
        stage(wh, "run-c", failing())

    assert sorted(wh.query('SELECT * FROM "orders"'), key=repr) == before


def test_sqlite_s_current_table_stores_what_a_plain_table_would(wh):
    """No per-row run id, and with a partition column no second copy of it: a reader's
    pages hold the data only (wider rows cost every scan). `_partition` is still a
    column readers can select, and `read_partition` still names the run."""
    if wh.dialect != "sqlite":
        pytest.skip("SQLite's current table (PostgreSQL's table layout: test_reader_layouts.py)")
    wh.stage_rows(spec=DAILY, run_id="run-1", attempt_no=1, partition=DAY, rows=daily_rows(7))
    wh.publish(spec_or_name=DAILY, partition=DAY, run_id="run-1", expected_run_id=None, actor="owner")

    stored = [name for (name,) in wh.query('SELECT name FROM pragma_table_info(?)', (DAILY.name,))]
    assert stored == list(DAILY.column_names)
    assert wh.query(f'SELECT DISTINCT "_partition" FROM "{DAILY.name}"') == [(DAY,)]
    assert ("_partition",) not in indexed_columns(wh, DAILY.name)  # the partition column's index serves
    rows = wh.read_partition(DAILY.name, DAY)
    assert len(rows) == 7 and {(r["_run_id"], r["_partition"]) for r in rows} == {("run-1", DAY)}
    stage(wh, "run-o", order_rows(3))  # no partition column: `_partition` is stored and indexed
    publish(wh, "run-o", None)
    assert [n for (n,) in wh.query("SELECT name FROM pragma_table_info('orders')")][-1] == "_partition"
    assert ("_partition",) in indexed_columns(wh, "orders")
