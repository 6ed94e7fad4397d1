"""The "load a source" seam (`WarehouseBackend.load_source` / `source_loads`, issue #18)
on every built-in backend: a source table created and loaded from rows or from Arrow,
read back through `source_sql` exactly as loaded (rows and Arrow giving the same
stored values), idempotent by load key, replaced in one step, and refused for a
produced dataset's name or a value its column cannot store."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pytest

from backfill_portal.backends import make_warehouse
from backfill_portal.backends.base import DatasetSpec
from backfill_portal.core.errors import ValidationError
from tests.backends.test_contract import BUILTIN_CONTRACT, backend_url, warehouse_url  # noqa: F401 (a fixture)

EVENTS = DatasetSpec(name="src_events", columns=(("event_id", "text"), ("amount", "numeric"), ("n", "integer"),
                                                 ("event_time", "timestamp")), business_key=("event_id",))
T0 = datetime(2022, 10, 1, 16, 0, 0, tzinfo=timezone.utc)
WINDOW = (T0, T0 + timedelta(days=1))


@pytest.fixture(params=BUILTIN_CONTRACT)
def wh(request, tmp_path):
    warehouse = make_warehouse(warehouse_url(request, tmp_path))
    warehouse.ensure_meta()
    yield warehouse
    warehouse.close()


def rows(n: int, *, start: int = 0, day: int = 0) -> list[tuple]:
    return [(f"e{i:05d}", round(i * 1.25, 2), i, T0 + timedelta(days=day, seconds=37 * i)) for i in range(start, start + n)]


def arrow(values: list[tuple]) -> pa.Table:
    ids, amounts, ns, times = zip(*values)
    return pa.table({"event_id": pa.array(ids), "amount": pa.array(amounts, pa.float64()), "n": pa.array(ns, pa.int64()),
                     "event_time": pa.array(times, pa.timestamp("us", tz="UTC"))})


def read(wh, start=WINDOW[0], end=WINDOW[1]) -> list[tuple]:
    source = wh.source_sql(name=EVENTS.name, time_column="event_time", start=start, end=end)
    got = wh.query(f"SELECT event_id, amount, n, event_time FROM {source} AS s ORDER BY event_id")
    return [(e, round(float(a), 2), int(n), t if isinstance(t, datetime) else datetime.fromisoformat(t + "+00:00"))
            for e, a, n, t in got]


def test_a_source_loaded_from_rows_reads_back_through_source_sql_within_its_time_range(wh):
    assert wh.source_loads(EVENTS.name) is None
    assert wh.load_source(spec=EVENTS, rows=rows(100), time_column="event_time") == 100
    assert wh.load_source(spec=EVENTS, rows=rows(10, start=100, day=1), time_column="event_time") == 10
    got = read(wh)
    assert got == [(e, a, n, t.astimezone(timezone.utc)) for e, a, n, t in rows(100)]
    assert len(read(wh, WINDOW[1], WINDOW[1] + timedelta(days=1))) == 10
    assert wh.source_loads(EVENTS.name) == {}  # loaded, no keyed load


def test_arrow_and_rows_store_the_same_values(wh, tmp_path):
    wh.load_source(spec=EVENTS, rows=rows(300), time_column="event_time")
    from_rows = read(wh)
    wh.load_source(spec=EVENTS, rows=arrow(rows(300)), time_column="event_time", replace=True)
    assert read(wh) == from_rows and len(from_rows) == 300
    # The stored text or instant is the engine's own `ts()` of the value (SQLite: its text).
    source = wh.source_sql(name=EVENTS.name, time_column="event_time", start=WINDOW[0], end=WINDOW[1])
    stored = wh.query(f"SELECT event_time FROM {source} AS s WHERE event_id = 'e00007'")[0][0]
    expected = wh.ts(T0 + timedelta(seconds=37 * 7))
    assert stored == expected or (isinstance(stored, datetime) and stored == expected)


def test_a_keyed_load_is_written_once_and_recorded_with_its_rows(wh):
    assert wh.load_source(spec=EVENTS, rows=arrow(rows(50)), load_key="2022-10-01") == 50
    assert wh.load_source(spec=EVENTS, rows=arrow(rows(50)), load_key="2022-10-01") == 0
    assert wh.load_source(spec=EVENTS, rows=rows(5, start=50), load_key="2022-10-02") == 5
    assert wh.source_loads(EVENTS.name) == {"2022-10-01": 50, "2022-10-02": 5}
    assert len(read(wh)) == 55


def test_replace_drops_the_earlier_rows_and_keys_in_the_same_step(wh):
    wh.load_source(spec=EVENTS, rows=rows(50), load_key="a")
    assert wh.load_source(spec=EVENTS, rows=rows(7, start=500), load_key="b", replace=True) == 7
    assert [r[0] for r in read(wh)] == [f"e{i:05d}" for i in range(500, 507)]
    assert wh.source_loads(EVENTS.name) == {"b": 7}


def test_a_bad_value_or_a_produced_datasets_name_is_refused_and_nothing_is_written(wh):
    wh.load_source(spec=EVENTS, rows=rows(3), load_key="a")
    with pytest.raises(ValidationError, match="amount"):
        wh.load_source(spec=EVENTS, rows=[*rows(2, start=10), ("x", "not a number", 1, T0)], load_key="b")
    with pytest.raises(ValidationError, match="timestamp|timezone|naive"):
        wh.load_source(spec=EVENTS, rows=[("y", 1.0, 1, datetime(2022, 10, 1, 17))], load_key="c")
    assert len(read(wh)) == 3 and wh.source_loads(EVENTS.name) == {"a": 3}
    produced = DatasetSpec(name="orders_out", columns=(("k", "text"),), business_key=("k",))
    wh.ensure_dataset(produced)
    with pytest.raises(ValidationError, match="produced dataset"):
        wh.load_source(spec=produced, rows=[("k1",)])
    assert wh.source_loads("orders_out") is None


@pytest.mark.parametrize("backend_url", [p for p in BUILTIN_CONTRACT if "iceberg" not in str(p)], indirect=True)
def test_a_sql_warehouse_loaded_before_the_seam_keeps_its_loaded_days(backend_url):
    """The demo recorded its days in `_bf_demo_loaded` before `load_source` existed: the
    first look at the keyed loads imports them, so an existing warehouse is not loaded twice."""
    wh = make_warehouse(backend_url)
    with wh.transaction():
        wh.execute('CREATE TABLE "src_events" (event_id TEXT, amount REAL, n INTEGER, event_time TEXT)')
        wh.execute("CREATE TABLE _bf_demo_loaded (dataset TEXT NOT NULL, day TEXT NOT NULL, seed INTEGER NOT NULL, "
                   "row_count INTEGER NOT NULL, PRIMARY KEY (dataset, day))")
        wh.execute("INSERT INTO _bf_demo_loaded VALUES ('src_events', '2022-10-01', 7, 12)")
    assert wh.source_loads(EVENTS.name) == {"2022-10-01": 12}
    assert wh.load_source(spec=EVENTS, rows=rows(3), load_key="2022-10-01") == 0
    wh.close()
