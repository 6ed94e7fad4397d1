"""The contract of a warehouse backend, run against every registered one: SQLite in a
temporary file, and a throwaway PostgreSQL database (skipped with the reason when
PostgreSQL is absent). A new backend runs this module against itself by overriding
the `backend_url` fixture (docs/extending.md, tests/extending/test_warehouse_backend.py).

These tests are the proof of DESIGN invariants 1-4 at the storage level: reruns are
identical, readers never see a partial partition, a failed run changes nothing
visible, and a retry knows where the previous attempt stopped. The ones that reach
the SQL layout directly (a version's table, `version_table()`, and `_bf_markers`: a
partial writer, an older marker table) hold for the SQL backends, whose bookkeeping is
shared.
"""
from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
import threading
import time
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path

import psycopg
import pytest

from backfill_portal.backends import (
    AlreadyCommitted,
    ColumnSpec,
    DatasetSpec,
    PointerMove,
    PublishConflict,
    PurgeRefused,
    VersionNotCommitted,
    WarehouseBackend,
    backend_class,
    make_warehouse,
    registered_schemes,
)
from backfill_portal.core.errors import ValidationError

PROJECT_ROOT = Path(__file__).resolve().parents[2]

ORDERS = DatasetSpec(
    name="orders",
    columns=(
        ("order_id", "text"),
        ("line_no", "integer"),
        ("customer", "text"),
        ("amount", "numeric"),
        ("created_at", "timestamp"),
        ("day", "date"),
        ("paid", "boolean"),
    ),
    business_key=("order_id", "line_no"),
    core_measure="amount",
)
DAY = "2024-03-01"
NEXT_DAY = "2024-03-02"
T0 = datetime(2024, 3, 1, tzinfo=timezone.utc)
# Rows written under a run's id without a marker, as a writer that did not use the
# staging transaction (or a future chunked-commit path) could leave them; `{table}`
# is the run's version table.
PARTIAL_ROW_INSERT = (
    'INSERT INTO "{table}" ("order_id", "line_no", "_run_id", "_partition", "_attempt")'
    " VALUES (?, ?, ?, ?, ?)"
)


def order_rows(n: int, *, seed: int = 0) -> list[tuple]:
    """n rows with unique composite keys (order_id, line_no); `seed` varies the content."""
    return [
        (
            f"o{i // 3:05d}",
            i % 3,
            f"c{(i * 7 + seed) % 50}",
            Decimal((i * 37 + seed) % 10000) / 100,
            T0 + timedelta(minutes=i),
            T0.date(),
            (i + seed) % 2 == 0,
        )
        for i in range(n)
    ]


def sweep_dead_writers(wh: WarehouseBackend, within: float = 30.0) -> list[str]:
    """The orphan sweep, repeated until it deletes something: a dead writer's lock goes
    with its process on a local disk, but lapses with its lease on an object store."""
    deadline = time.monotonic() + within
    while not (deleted := wh.sweep_orphans(ORDERS)) and time.monotonic() < deadline:
        time.sleep(0.25)
    return deleted


def files_layout(wh: WarehouseBackend) -> bool:
    """A backend whose versions are data files under the run's directory (Iceberg), not
    rows of a version table: the helpers below reach its layout through its public
    `run_files`, `run_location` and `version_sql`."""
    return hasattr(wh, "run_files")


def needs_sql_layout(wh: WarehouseBackend) -> None:
    if files_layout(wh):
        pytest.skip("reaches the SQL backends' tables (_bf_markers, a version table) directly")


def count_version_rows(wh: WarehouseBackend, run_id: str, spec: DatasetSpec = ORDERS) -> int:
    """The rows of the run's version (Iceberg: of its committed files; none without a marker)."""
    if files_layout(wh):
        if wh.marker(run_id) is None:
            return 0
        return wh.query(f"SELECT COUNT(*) FROM {wh.version_sql(spec, run_id)} AS v")[0][0]
    table = wh.version_table(spec, run_id)
    if not wh.table_exists(table):
        return 0
    if table != spec.versions_table:  # the run's own table: all its rows (PostgreSQL adds
        return wh.query(f'SELECT COUNT(*) FROM "{table}"')[0][0]  # _run_id after the last one)
    return wh.query(f'SELECT COUNT(*) FROM "{table}" WHERE "_run_id" = ?', (run_id,))[0][0]


def count_written_rows(wh: WarehouseBackend, run_id: str, spec: DatasetSpec = ORDERS) -> int:
    """Rows really written under the run so far, committed or not: on the SQL backends the
    version's rows (what its open transaction sees), on Iceberg the rows of every whole
    data file under the run's directories."""
    if not files_layout(wh):
        return count_version_rows(wh, run_id, spec)
    return sum(wh.query("SELECT COUNT(*) FROM read_parquet(?)", (path,))[0][0] for path in wh.run_files(spec, run_id))


def version_rows(wh: WarehouseBackend, run_id: str, spec: DatasetSpec = ORDERS) -> list[tuple]:
    """A version's rows as the driver returns them, in a canonical order."""
    columns = ", ".join(f'"{c}"' for c in spec.column_names)
    if files_layout(wh):
        return sorted(wh.query(f"SELECT {columns} FROM {wh.version_sql(spec, run_id)} AS v"), key=repr)
    rows = wh.query(f'SELECT {columns} FROM "{wh.version_table(spec, run_id)}" WHERE "_run_id" = ?', (run_id,))
    return sorted(rows, key=repr)


def version_bookkeeping(wh: WarehouseBackend, run_id: str, spec: DatasetSpec = ORDERS) -> list[tuple]:
    """The distinct (_attempt, _partition) of a version's rows."""
    if files_layout(wh):
        return wh.query(f'SELECT DISTINCT "_attempt", "_partition" FROM {wh.version_sql(spec, run_id)} AS v')
    return wh.query(f'SELECT DISTINCT "_attempt", "_partition" FROM "{wh.version_table(spec, run_id)}" '
                    'WHERE "_run_id" = ?', (run_id,))


def leave_partial_rows(wh: WarehouseBackend, run_id: str, rows: list[tuple], spec: DatasetSpec = ORDERS) -> None:
    """Rows under `run_id` without a marker, outside any staging transaction (a table of
    their own where the backend keeps one per version; a data file in the run's
    directory on Iceberg)."""
    wh.ensure_dataset(spec)
    if files_layout(wh):
        for i, (order_id, line_no, run, partition, attempt) in enumerate(rows):
            directory = wh.run_location(spec, partition, run)
            wh.storage.make_dir(directory)
            path = wh.storage.join(directory, f"part-left-{i}.parquet")
            wh.query(f"COPY (SELECT ?::VARCHAR AS order_id, ?::BIGINT AS line_no, ?::VARCHAR AS _run_id, "
                     f"?::VARCHAR AS _partition, ?::BIGINT AS _attempt) TO '{path}' (FORMAT parquet)",
                     (order_id, line_no, run, partition, attempt))
        return
    table = wh.version_table(spec, run_id)
    if not wh.table_exists(table):
        wh.execute(f'CREATE TABLE "{table}" AS SELECT * FROM "{spec.name}" WHERE 1 = 0')
        for column, kind in (("_run_id", "text"), ("_partition", "text"), ("_attempt", "integer")):
            if column not in wh.columns_of(f'SELECT * FROM "{table}"'):  # a "table"-layout reader stores none
                wh.execute(f'ALTER TABLE "{table}" ADD COLUMN "{column}" {kind}')
    for row in rows:
        wh.execute(PARTIAL_ROW_INSERT.format(table=table), row)


def as_tuples(dicts: list[dict], spec: DatasetSpec = ORDERS) -> list[tuple]:
    return sorted((tuple(d[c] for c in spec.column_names) for d in dicts), key=repr)


def stage(wh: WarehouseBackend, run_id: str, rows, *, partition: str = DAY, attempt_no: int = 1,
          spec: DatasetSpec = ORDERS, **kwargs):
    return wh.stage_rows(spec=spec, run_id=run_id, attempt_no=attempt_no, partition=partition, rows=rows, **kwargs)


def publish(wh: WarehouseBackend, run_id: str, expected: str | None, *, partition: str = DAY, actor: str = "owner"):
    return wh.publish(spec_or_name=ORDERS, partition=partition, run_id=run_id, expected_run_id=expected, actor=actor)


def in_threads(db: WarehouseBackend, n: int, work) -> list[tuple[str, object]]:
    """Run work(i) in n threads released together. Each thread gets its own
    connection (a backend keeps one per thread) and closes it when done."""
    barrier = threading.Barrier(n)
    results: list[tuple[str, object]] = [("not run", None)] * n

    def run(i: int) -> None:
        try:
            barrier.wait()
            results[i] = ("ok", work(i))
        except Exception as exc:  # collected and asserted on by the caller
            results[i] = ("error", exc)
        finally:
            db.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a worker thread hung"
    return results


# -- fixtures ---------------------------------------------------------------------------


# The registered backends under contract, by name: each yields the URL of a fresh,
# empty warehouse. test_every_registered_backend_is_under_contract keeps it complete.
# PostgreSQL in both reader layouts: datasets the catalog leaves to the warehouse get
# the URL's `reader_layout` (partitioned by default).
SQL_CONTRACT = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres),
                pytest.param("postgresql-table", marks=pytest.mark.postgres)]
# Iceberg: pyiceberg's SQL catalog in a SQLite file or in the PostgreSQL database, the files
# under tmp_path or in a bucket of an S3 API server (moto's).
BUILTIN_CONTRACT = [*SQL_CONTRACT, "iceberg", "iceberg-s3",
                    pytest.param("iceberg-postgresql", marks=pytest.mark.postgres)]


@pytest.fixture(params=BUILTIN_CONTRACT)
def backend_url(request, tmp_path):
    return warehouse_url(request, tmp_path)


def warehouse_url(request, tmp_path) -> str:
    """The URL of a fresh, empty warehouse of the kind `request.param` names."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'warehouse.sqlite3'}"
    if request.param == "iceberg":  # pyiceberg's SQL catalog in a SQLite file, files under tmp_path
        return f"iceberg+sqlite:///{tmp_path / 'catalog.db'}?warehouse={tmp_path / 'iceberg'}"
    if request.param == "iceberg-s3":  # the files in a bucket of an S3 API server
        from tests.conftest import iceberg_s3_url

        return iceberg_s3_url(tmp_path, request.getfixturevalue("s3_endpoint"))
    url = request.getfixturevalue("pg_url")
    with psycopg.connect(url, autocommit=True) as conn:  # a clean schema per test
        conn.execute("DROP SCHEMA public CASCADE")
        conn.execute("CREATE SCHEMA public")
    if request.param == "iceberg-postgresql":  # the catalog in PostgreSQL
        return f"iceberg+{url}?warehouse={tmp_path / 'iceberg'}"
    if request.param == "postgresql-table":  # one plain reader table per dataset
        return f"{url}?reader_layout=table"
    return url


@pytest.fixture
def wh(backend_url):
    warehouse = make_warehouse(backend_url)
    yield warehouse
    warehouse.close()


def test_every_registered_backend_is_under_contract(tmp_path):
    """A backend registered in backfill_portal.backends must be in BUILTIN_CONTRACT (or,
    outside the package, run this module against itself as
    tests/extending/test_warehouse_backend.py does)."""
    covered = {backend_class(f"sqlite:///{tmp_path / 'w.sqlite3'}"), backend_class("postgresql://h/d"),
               backend_class(f"iceberg+sqlite:///{tmp_path / 'c.db'}")}
    builtin = {cls for cls in registered_schemes().values() if cls.__module__.startswith("backfill_portal.")}
    assert builtin == covered


# -- staging: rows and marker, all or nothing (invariants 3 and 4) ------------------------


def test_stage_writes_rows_and_marker_together(wh):
    marker = stage(wh, "run-1", order_rows(100))

    assert (marker.run_id, marker.attempt_no, marker.dataset, marker.partition) == ("run-1", 1, "orders", DAY)
    assert marker.row_count == 100 == count_version_rows(wh, "run-1")
    assert marker.fingerprint == wh.fingerprint(spec=ORDERS, run_id="run-1")
    assert marker.committed_at.tzinfo is not None
    assert wh.marker("run-1") == marker
    assert wh.marker("run-never") is None


def test_crash_mid_stage_leaves_no_rows_and_no_marker_and_the_retry_publishes_exact_rows(wh):
    rows = order_rows(1000)
    rows_in_the_failed_transaction = []

    def rows_then_worker_lost():
        for i, row in enumerate(rows):
            if i == 920:  # 92% through
                rows_in_the_failed_transaction.append(count_written_rows(wh, "run-1"))
                raise RuntimeError("worker lost")
            yield row

    with pytest.raises(RuntimeError, match="worker lost"):
        stage(wh, "run-1", rows_then_worker_lost(), chunk_size=100)

    # Nine chunks had really been written before the failure...
    assert rows_in_the_failed_transaction == [900]
    # ...and none of them, nor a marker, survived it.
    assert count_version_rows(wh, "run-1") == 0 == count_written_rows(wh, "run-1")
    assert wh.marker("run-1") is None

    marker = stage(wh, "run-1", rows, attempt_no=2, chunk_size=100)
    publish(wh, "run-1", None)

    assert marker.attempt_no == 2 and marker.row_count == 1000
    assert as_tuples(wh.read_partition("orders", DAY)) == sorted(version_rows(wh, "run-1"), key=repr)
    profile = wh.profile(spec=ORDERS, run_id="run-1")
    assert (profile.row_count, profile.distinct_keys, profile.duplicate_keys, profile.null_keys) == (1000, 1000, 0, 0)


def test_killed_worker_mid_stage_leaves_no_rows_and_no_marker(wh):
    """A real crash: the worker process is SIGKILLed while its staging transaction is
    open, so no Python cleanup or ROLLBACK runs. The database must discard it."""
    wh.ensure_dataset(ORDERS)
    script = textwrap.dedent(
        """
        import sys, time
        import importlib
        from backfill_portal.backends import make_warehouse
        from tests.backends.test_contract import DAY, ORDERS, count_written_rows, order_rows

        importlib.import_module(sys.argv[2])  # the backend's module: registers it
        wh = make_warehouse(sys.argv[1])

        def rows():
            for i, row in enumerate(order_rows(1000)):
                if i == 920:
                    print(count_written_rows(wh, "run-killed"), flush=True)
                    time.sleep(120)  # holding the transaction open until killed
                yield row

        wh.stage_rows(spec=ORDERS, run_id="run-killed", attempt_no=1, partition=DAY, rows=rows(), chunk_size=100)
        """
    )
    worker = subprocess.Popen(
        [sys.executable, "-c", script, wh.url, type(wh).__module__],
        cwd=PROJECT_ROOT,
        env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = worker.stdout.readline()
        assert line.strip() == "900", f"worker did not reach the crash point: {line!r} {worker.stderr.read()}"
    finally:
        worker.kill()
        worker.wait(timeout=30)

    assert count_version_rows(wh, "run-killed") == 0
    assert wh.marker("run-killed") is None
    if files_layout(wh):  # the dead writer's whole files stay, invisible, until swept
        assert wh.read_partition("orders", DAY) == []
        assert len(sweep_dead_writers(wh)) == 9
        assert count_written_rows(wh, "run-killed") == 0
    # The retry stages cleanly.
    assert stage(wh, "run-killed", order_rows(1000), attempt_no=2).row_count == 1000


def test_staging_a_committed_run_again_raises_already_committed_and_writes_nothing(wh):
    first = stage(wh, "run-1", order_rows(100))
    consumed = []

    def more_rows():
        consumed.append(True)
        yield from order_rows(50, seed=9)

    with pytest.raises(AlreadyCommitted) as refused:
        stage(wh, "run-1", more_rows(), attempt_no=2)
    with pytest.raises(AlreadyCommitted):
        wh.stage_select(spec=ORDERS, run_id="run-1", attempt_no=3, partition=DAY,
                        select_sql=f"SELECT * FROM {wh.ref_sql(spec=ORDERS, pins={DAY: 'run-1'})} AS v")

    assert refused.value.marker == first
    assert consumed == []
    assert count_version_rows(wh, "run-1") == 100
    assert wh.marker("run-1") == first
    assert wh.fingerprint(spec=ORDERS, run_id="run-1") == first.fingerprint


def test_staging_clears_rows_a_dead_attempt_left_outside_a_transaction(wh):
    leave_partial_rows(wh, "run-1", [("stale", 1, "run-1", DAY, 1)])

    marker = stage(wh, "run-1", order_rows(10), attempt_no=2)

    assert marker.row_count == 10 == count_version_rows(wh, "run-1")
    assert "stale" not in {row[0] for row in version_rows(wh, "run-1")}


def test_stage_select_writes_the_select_output_as_the_runs_version(wh):
    source = stage(wh, "run-source", order_rows(60))
    pinned = wh.ref_sql(spec=ORDERS, pins={DAY: "run-source"})

    copy = wh.stage_select(spec=ORDERS, run_id="run-copy", attempt_no=1, partition=DAY,
                           select_sql=f"SELECT * FROM {pinned} AS src")
    some = wh.stage_select(spec=ORDERS, run_id="run-some", attempt_no=2, partition=DAY,
                           select_sql=f"SELECT * FROM {pinned} AS src WHERE line_no = ?", params=(1,))

    # The same data staged from SQL or from Python is the same version.
    assert copy.row_count == 60 and copy.fingerprint == source.fingerprint
    assert version_rows(wh, "run-copy") == version_rows(wh, "run-source")
    assert some.row_count == 20 and some.attempt_no == 2
    attempts = version_bookkeeping(wh, "run-some")
    assert attempts == [(2, DAY)]


def test_stage_rows_refuses_naive_timestamps_and_leaves_nothing(wh):
    rows = order_rows(5)
    rows[3] = rows[3][:4] + (datetime(2024, 3, 1, 12, 0),) + rows[3][5:]

    with pytest.raises(ValidationError, match="created_at"):
        stage(wh, "run-1", rows)

    assert wh.marker("run-1") is None and count_version_rows(wh, "run-1") == 0


def test_equal_instants_in_any_timezone_or_notation_are_stored_alike(wh):
    shanghai = timezone(timedelta(hours=8))
    as_utc = order_rows(30)
    as_shanghai = [r[:4] + (r[4].astimezone(shanghai),) + r[5:] for r in as_utc]
    as_text = [r[:4] + (r[4].isoformat(),) + r[5:] for r in as_utc]

    fingerprints = {stage(wh, f"run-{i}", rows).fingerprint for i, rows in enumerate([as_utc, as_shanghai, as_text])}

    assert len(fingerprints) == 1


# -- publication: visibility by one pointer switch (invariant 2) --------------------------


def test_staged_rows_are_invisible_until_published_and_a_republish_switches_readers(wh):
    stage(wh, "run-a", order_rows(100))
    stage(wh, "run-b", order_rows(60, seed=5))
    stage(wh, "run-next", order_rows(10), partition=NEXT_DAY)

    assert wh.read_partition("orders", DAY) == []

    publish(wh, "run-a", None)
    seen = wh.read_partition("orders", DAY)
    assert {r["_run_id"] for r in seen} == {"run-a"} and as_tuples(seen) == version_rows(wh, "run-a")

    publish(wh, "run-b", "run-a")
    seen = wh.read_partition("orders", DAY)
    assert {r["_run_id"] for r in seen} == {"run-b"} and as_tuples(seen) == version_rows(wh, "run-b")
    assert wh.current("orders", DAY) == "run-b"
    # Another partition's unpublished version stays invisible.
    assert wh.read_partition("orders", NEXT_DAY) == []
    assert wh.current("orders", NEXT_DAY) is None


def test_publish_with_a_stale_expected_run_id_conflicts_and_changes_nothing(wh):
    for run_id, seed in [("run-a", 0), ("run-b", 1), ("run-c", 2)]:
        stage(wh, run_id, order_rows(20, seed=seed))
    publish(wh, "run-a", None)
    publish(wh, "run-b", "run-a")

    with pytest.raises(PublishConflict) as conflict:
        publish(wh, "run-c", "run-a")

    assert (conflict.value.current_run_id, conflict.value.expected_run_id) == ("run-b", "run-a")
    assert not conflict.value.already_published
    assert wh.current("orders", DAY) == "run-b"
    assert [r.run_id for r in wh.history("orders", DAY)] == ["run-b", "run-a"]
    assert {r["_run_id"] for r in wh.read_partition("orders", DAY)} == {"run-b"}


def test_first_publish_conflicts_when_someone_published_first(wh):
    stage(wh, "run-a", order_rows(5))
    stage(wh, "run-b", order_rows(5, seed=1))
    publish(wh, "run-a", None)

    with pytest.raises(PublishConflict) as conflict:
        publish(wh, "run-b", None)

    assert conflict.value.current_run_id == "run-a" and conflict.value.expected_run_id is None
    assert wh.current("orders", DAY) == "run-a"


def test_a_retried_publish_reports_that_it_already_won(wh):
    stage(wh, "run-a", order_rows(5))
    stage(wh, "run-b", order_rows(5, seed=1))
    publish(wh, "run-a", None)
    publish(wh, "run-b", "run-a")

    with pytest.raises(PublishConflict) as conflict:  # the task ran twice
        publish(wh, "run-b", "run-a")

    assert conflict.value.already_published
    assert len(wh.history("orders", DAY)) == 2


def test_publish_refuses_a_run_without_a_commit_marker_for_that_partition(wh):
    stage(wh, "run-next", order_rows(5), partition=NEXT_DAY)

    with pytest.raises(VersionNotCommitted):
        publish(wh, "run-never-staged", None)
    with pytest.raises(VersionNotCommitted):
        publish(wh, "run-next", None, partition=DAY)

    assert wh.current("orders", DAY) is None
    assert wh.history("orders", DAY) == []


def test_history_is_serial_and_newest_first(wh):
    for run_id, seed in [("run-a", 0), ("run-b", 1), ("run-c", 2)]:
        stage(wh, run_id, order_rows(5, seed=seed))
    records = [publish(wh, "run-a", None, actor="alice"), publish(wh, "run-b", "run-a", actor="bob"),
               publish(wh, "run-c", "run-b", actor="carol")]

    history = wh.history("orders", DAY)

    assert history == records[::-1]
    assert [(r.run_id, r.previous_run_id) for r in history] == [
        ("run-c", "run-b"), ("run-b", "run-a"), ("run-a", None),
    ]
    assert history[0].id > history[1].id > history[2].id
    assert {r.action for r in history} == {"publish"}
    assert [r.actor for r in history] == ["carol", "bob", "alice"]


def test_fifty_concurrent_publishes_of_one_partition_exactly_one_wins(wh):
    stage(wh, "run-base", order_rows(5))
    publish(wh, "run-base", None)
    candidates = [f"run-{i:02d}" for i in range(50)]
    for i, run_id in enumerate(candidates):
        stage(wh, run_id, order_rows(5, seed=i + 1))

    results = in_threads(wh, 50, lambda i: publish(wh, candidates[i], "run-base", actor=f"worker-{i}"))

    wins = [value for status, value in results if status == "ok"]
    errors = [value for status, value in results if status == "error"]
    assert len(wins) == 1, errors[:3]
    assert len(errors) == 49 and all(isinstance(e, PublishConflict) for e in errors), errors[:3]
    winner = wins[0].run_id
    assert {(e.current_run_id, e.expected_run_id) for e in errors} == {(winner, "run-base")}
    assert wh.current("orders", DAY) == winner
    history = wh.history("orders", DAY)
    assert [(r.run_id, r.previous_run_id) for r in history] == [(winner, "run-base"), ("run-base", None)]


def test_a_reader_never_sees_a_partial_empty_or_mixed_partition_while_versions_switch(wh):
    versions = {f"run-{i:02d}": 40 + 3 * i for i in range(51)}  # different sizes and contents
    for i, (run_id, size) in enumerate(versions.items()):
        stage(wh, run_id, order_rows(size, seed=i))
    expected = {run_id: version_rows(wh, run_id) for run_id in versions}
    run_ids = list(versions)
    publish(wh, run_ids[0], None)

    stop = threading.Event()
    reads: list[list[dict]] = []

    def reader() -> None:
        try:
            while not stop.is_set():
                reads.append(wh.read_partition("orders", DAY))
        finally:
            wh.close()

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for previous, run_id in zip(run_ids, run_ids[1:]):
            publish(wh, run_id, previous)
            time.sleep(0.005)  # let the reader interleave
    finally:
        stop.set()
        thread.join(timeout=60)

    assert len(reads) > 50
    observed = set()
    for rows in reads:
        seen_runs = {r["_run_id"] for r in rows}
        assert len(seen_runs) == 1, f"empty or mixed read: {sorted(seen_runs)}"
        (run_id,) = seen_runs
        assert len(rows) == versions[run_id]
        assert as_tuples(rows) == expected[run_id]
        observed.add(run_id)
    assert len(observed) > 5  # the reader really watched the pointer move


# -- rollback, purge, pinning --------------------------------------------------------------


def test_rollback_moves_the_pointer_back_with_compare_and_set(wh):
    stage(wh, "run-good", order_rows(30))
    stage(wh, "run-bad", order_rows(30, seed=3))
    publish(wh, "run-good", None)
    publish(wh, "run-bad", "run-good")

    record = wh.rollback(name="orders", partition=DAY, to_run_id="run-good", expected_run_id="run-bad", actor="oncall")

    assert (record.action, record.run_id, record.previous_run_id) == ("rollback", "run-good", "run-bad")
    assert record.actor == "oncall"
    assert wh.current("orders", DAY) == "run-good"
    assert as_tuples(wh.read_partition("orders", DAY)) == version_rows(wh, "run-good")
    assert [(r.action, r.run_id) for r in wh.history("orders", DAY)] == [
        ("rollback", "run-good"), ("publish", "run-bad"), ("publish", "run-good"),
    ]


def test_rollback_conflicts_when_someone_published_since(wh):
    for run_id, seed in [("run-a", 0), ("run-b", 1), ("run-c", 2)]:
        stage(wh, run_id, order_rows(5, seed=seed))
    publish(wh, "run-a", None)
    publish(wh, "run-b", "run-a")
    publish(wh, "run-c", "run-b")  # published after the on-call looked

    with pytest.raises(PublishConflict) as conflict:
        wh.rollback(name="orders", partition=DAY, to_run_id="run-a", expected_run_id="run-b", actor="oncall")

    assert conflict.value.current_run_id == "run-c"
    assert wh.current("orders", DAY) == "run-c"
    assert len(wh.history("orders", DAY)) == 3


def test_rollback_many_moves_every_pointer_or_none(wh):
    for partition in (DAY, NEXT_DAY):
        stage(wh, f"old-{partition}", order_rows(3), partition=partition)
        stage(wh, f"new-{partition}", order_rows(4, seed=1), partition=partition)
        publish(wh, f"old-{partition}", None, partition=partition)
        publish(wh, f"new-{partition}", f"old-{partition}", partition=partition)
    back = [PointerMove("orders", p, f"old-{p}", f"new-{p}") for p in (DAY, NEXT_DAY)]

    # One stale expectation: neither pointer moves.
    stale = [back[0], back[1]._replace(expected_run_id="someone-else")]
    with pytest.raises(PublishConflict):
        wh.rollback_many(stale, actor="oncall")
    assert wh.current_many("orders", [DAY, NEXT_DAY]) == {DAY: f"new-{DAY}", NEXT_DAY: f"new-{NEXT_DAY}"}
    assert [r.action for r in wh.history("orders", DAY)] == ["publish", "publish"]

    records = wh.rollback_many(back, actor="oncall")
    assert [(r.partition, r.run_id, r.previous_run_id, r.action) for r in records] == [
        (DAY, f"old-{DAY}", f"new-{DAY}", "rollback"), (NEXT_DAY, f"old-{NEXT_DAY}", f"new-{NEXT_DAY}", "rollback")]
    assert wh.current_many("orders", [DAY, NEXT_DAY]) == {DAY: f"old-{DAY}", NEXT_DAY: f"old-{NEXT_DAY}"}


def test_rollback_refuses_a_version_that_was_never_published(wh):
    stage(wh, "run-a", order_rows(5))
    stage(wh, "run-unverified", order_rows(5, seed=1))
    publish(wh, "run-a", None)

    with pytest.raises(VersionNotCommitted):
        wh.rollback(name="orders", partition=DAY, to_run_id="run-unverified", expected_run_id="run-a", actor="oncall")

    assert wh.current("orders", DAY) == "run-a"


def test_purge_refuses_the_current_version_and_removes_an_old_one(wh):
    stage(wh, "run-old", order_rows(30))
    stage(wh, "run-new", order_rows(20, seed=1))
    publish(wh, "run-old", None)
    publish(wh, "run-new", "run-old")

    with pytest.raises(PurgeRefused):
        wh.purge(spec=ORDERS, run_id="run-new")
    assert wh.marker("run-new") is not None and count_version_rows(wh, "run-new") == 20

    assert wh.purge(spec=ORDERS, run_id="run-old") == 30
    assert wh.marker("run-old") is None and count_version_rows(wh, "run-old") == 0
    assert {r["_run_id"] for r in wh.read_partition("orders", DAY)} == {"run-new"}
    # A purged version can no longer be shown.
    with pytest.raises(VersionNotCommitted):
        wh.rollback(name="orders", partition=DAY, to_run_id="run-old", expected_run_id="run-new", actor="oncall")


def test_ref_sql_selects_exactly_the_pinned_versions(wh):
    stage(wh, "run-published", order_rows(10))
    stage(wh, "run-pinned", order_rows(12, seed=4))
    stage(wh, "run-other-day", order_rows(7, seed=5), partition=NEXT_DAY)
    stage(wh, "run-quote", order_rows(3, seed=6), partition="it's")
    publish(wh, "run-published", None)
    columns = ", ".join(f'"{c}"' for c in ORDERS.column_names)

    def select(pins):
        return sorted(wh.query(f"SELECT {columns} FROM {wh.ref_sql(spec=ORDERS, pins=pins)} AS v"), key=repr)

    assert select({DAY: "run-pinned"}) == version_rows(wh, "run-pinned")
    assert select({DAY: "run-pinned", NEXT_DAY: "run-other-day"}) == sorted(
        version_rows(wh, "run-pinned") + version_rows(wh, "run-other-day"), key=repr
    )
    assert select({"it's": "run-quote"}) == version_rows(wh, "run-quote")
    # A pin is a (partition, run) pair: the right run under the wrong partition is nothing.
    assert select({NEXT_DAY: "run-pinned"}) == []


def test_ref_sql_with_no_pins_has_the_declared_columns_and_no_rows(wh):
    wh.ensure_dataset(ORDERS)
    stage(wh, "run-a", order_rows(5))

    sql = wh.ref_sql(spec=ORDERS, pins={})

    assert wh.columns_of(sql) == list(ORDERS.column_names)
    assert wh.query(f"SELECT * FROM {sql} AS v") == []


def test_ref_sql_refuses_values_it_cannot_render_safely(wh):
    with pytest.raises(ValidationError):
        wh.ref_sql(spec=ORDERS, pins={DAY: "run?"})
    with pytest.raises(ValidationError):
        wh.ref_sql(spec=ORDERS, pins={"day\n": "run-a"})


# -- fingerprint and profile (invariant 1) --------------------------------------------------


def test_fingerprint_ignores_row_order(wh):
    rows = order_rows(200)
    shuffled = rows[:]
    random.Random(7).shuffle(shuffled)

    fingerprints = {stage(wh, run_id, r).fingerprint
                    for run_id, r in [("run-1", rows), ("run-2", rows[::-1]), ("run-3", shuffled)]}

    assert len(fingerprints) == 1


def test_fingerprint_counts_every_copy_of_a_row(wh):
    rows = order_rows(50)

    base = stage(wh, "run-base", rows).fingerprint
    once = stage(wh, "run-dup1", rows + [rows[0]]).fingerprint
    twice = stage(wh, "run-dup2", rows + [rows[0], rows[0]]).fingerprint  # XOR would cancel these

    assert len({base, once, twice}) == 3


def test_fingerprint_changes_with_any_changed_value(wh):
    rows = order_rows(50)
    base = stage(wh, "run-base", rows).fingerprint
    variants = {
        "amount": rows[:10] + [rows[10][:3] + (rows[10][3] + Decimal("0.01"),) + rows[10][4:]] + rows[11:],
        "text": rows[:10] + [(rows[10][0], rows[10][1], "someone else") + rows[10][3:]] + rows[11:],
        "null vs empty": rows[:10] + [(rows[10][0], rows[10][1], None) + rows[10][3:]] + rows[11:],
        "empty": rows[:10] + [(rows[10][0], rows[10][1], "") + rows[10][3:]] + rows[11:],
        "timestamp": rows[:10] + [rows[10][:4] + (rows[10][4] + timedelta(seconds=1),) + rows[10][5:]] + rows[11:],
        "boolean": rows[:10] + [rows[10][:6] + (not rows[10][6],)] + rows[11:],
    }

    fingerprints = {name: stage(wh, f"run-{i}", r).fingerprint for i, (name, r) in enumerate(variants.items())}

    assert base not in fingerprints.values()
    assert len(set(fingerprints.values())) == len(variants)


def test_fingerprint_ignores_float_noise_below_the_sixth_decimal(wh):
    summed = [r[:3] + (0.1 + 0.2,) + r[4:] for r in order_rows(5)]  # 0.30000000000000004
    exact = [r[:3] + (0.3,) + r[4:] for r in order_rows(5)]

    assert stage(wh, "run-1", summed).fingerprint == stage(wh, "run-2", exact).fingerprint


def test_rerunning_the_same_data_ten_times_publishes_an_identical_partition(wh):
    """Invariant 1: same inputs, ten runs, ten publishes; the published partition's
    row count, key count, measure and fingerprint never move."""
    observed = set()
    previous = None
    for i in range(10):
        run_id = f"rerun-{i}"
        rows = order_rows(300)
        random.Random(i).shuffle(rows)  # a rerun need not write in the same order
        stage(wh, run_id, rows)
        publish(wh, run_id, previous)
        previous = run_id
        p = wh.profile(spec=ORDERS, run_id=wh.current("orders", DAY))
        observed.add((p.row_count, p.distinct_keys, p.duplicate_keys, p.measure_sum, p.fingerprint,
                      len(wh.read_partition("orders", DAY))))

    assert len(observed) == 1
    (row_count, distinct_keys, duplicate_keys, _, _, visible) = observed.pop()
    assert row_count == distinct_keys == visible == 300 and duplicate_keys == 0


def test_profile_counts_null_and_duplicate_composite_keys(wh):
    def row(order_id, line_no, amount):
        return (order_id, line_no, "c", amount, T0, T0.date(), True)

    stage(wh, "run-1", [
        row("a", 1, Decimal("1")),
        row("a", 2, Decimal("2")),
        row("b", 1, Decimal("3")),
        row("b", 1, Decimal("4")),  # duplicate key
        row("b", 1, Decimal("5")),  # and again
        row(None, 1, Decimal("6")),  # NULL key part
        row("c", None, Decimal("7")),  # NULL key part
        row(None, None, None),
        row("x", 12, Decimal("0.5")),  # ("x", 12) and ("x1", 2) concatenate alike
        row("x1", 2, Decimal("0.25")),
    ])

    profile = wh.profile(spec=ORDERS, run_id="run-1")

    assert profile.row_count == 10
    assert profile.null_keys == 3
    assert profile.distinct_keys == 5
    assert profile.duplicate_keys == 2
    assert profile.measure_sum == pytest.approx(28.75)
    assert profile.fingerprint == wh.marker("run-1").fingerprint
    assert profile.columns == [(c.name, c.type) for c in ORDERS.columns]


def test_profile_of_a_dataset_without_a_core_measure_has_no_sum(wh):
    events = DatasetSpec(name="events", columns=(("event_id", "text"),), business_key=("event_id",))
    wh.stage_rows(spec=events, run_id="run-1", attempt_no=1, partition=DAY, rows=[("e1",), ("e2",)])

    profile = wh.profile(spec=events, run_id="run-1")

    assert (profile.row_count, profile.distinct_keys, profile.measure_sum) == (2, 2, None)


def test_the_marker_holds_the_numbers_taken_with_the_rows(wh):
    """Invariant 4's marker is also the version's attestation: verification and
    reconciliation read its numbers instead of scanning the version again."""
    rows = order_rows(30)
    marker = stage(wh, "run-1", rows + [rows[0], (None,) + rows[1][1:]])

    assert (marker.row_count, marker.null_keys, marker.distinct_keys) == (32, 1, 30)
    assert marker.measure_sum == pytest.approx(float(sum(r[3] for r in rows) + rows[0][3] + rows[1][3]))
    assert marker.numbers_of == "order_id,line_no|amount"
    # Rows changed behind the adapter's back (nothing in the portal does) do not
    # change what the committed version attests.
    if files_layout(wh):
        for path in wh.run_files(ORDERS, "run-1"):
            wh.storage.delete(path)
    else:
        wh.execute(f'DELETE FROM "{wh.version_table(ORDERS, "run-1")}" WHERE "_run_id" = ?', ("run-1",))
    profile = wh.profile(spec=ORDERS, run_id="run-1")
    assert (profile.row_count, profile.null_keys, profile.distinct_keys, profile.duplicate_keys) == (32, 1, 30, 1)


def _counted(rows: list[tuple], key: list[int], measure: int) -> tuple:
    """(rows, rows with a NULL key part, distinct complete keys, measure sum), in Python."""
    keys = [tuple(r[i] for i in key) for r in rows]
    complete = {k for k in keys if None not in k}
    return (len(rows), sum(1 for k in keys if None in k), len(complete),
            pytest.approx(sum(float(r[measure]) for r in rows if r[measure] is not None)))


def stage_as_select(wh: WarehouseBackend, spec: DatasetSpec, run_id: str, rows: list[tuple]):
    """Stage `rows` as `run_id` through stage_select: from another version holding them."""
    stage(wh, f"{run_id}-source", rows, spec=spec, partition=NEXT_DAY)
    pinned = wh.ref_sql(spec=spec, pins={NEXT_DAY: f"{run_id}-source"})
    return wh.stage_select(spec=spec, run_id=run_id, attempt_no=1, partition=DAY,
                           select_sql=f"SELECT * FROM {pinned} AS src")


@pytest.mark.parametrize("by", ["rows", "select"])
def test_the_marker_numbers_equal_a_count_of_the_published_rows(wh, by):
    """The marker's numbers and fingerprint are taken in one pass with the rows (on
    PostgreSQL one scan of the new version): they must equal an independent count of
    the rows readers then see, with NULL key parts, duplicate keys, whole duplicate
    rows and keys that differ only in case or trailing space; and the fingerprint the
    same as the one computed on its own."""
    def order(order_id, line_no, amount):
        return (order_id, line_no, "c", amount, T0, T0.date(), True)

    composite = order_rows(12) + [
        order("o00000", 0, Decimal("9")),  # the first row's key again
        order_rows(12)[3], order_rows(12)[3],  # a whole row twice more
        order(None, 1, Decimal("1")), order("n", None, Decimal("2")), order(None, None, Decimal("3")),
        order("x", 12, Decimal("0.5")), order("x1", 2, Decimal("0.25")),  # concatenate alike
        order("A", 1, Decimal("1")), order("a", 1, Decimal("1")), order("a ", 1, Decimal("1")),
        order("", 1, Decimal("1")),
    ]
    events = DatasetSpec(name="events", columns=(("event_id", "text"), ("amount", "numeric")),
                         business_key=("event_id",), core_measure="amount")
    single = [("e1", Decimal("1")), ("e1", Decimal("2")), ("E1", Decimal("3")), ("e1 ", Decimal("4")),
              ("", Decimal("5")), (None, Decimal("6")), (None, Decimal("7")), ("e2", None), ("e2", None)]
    for spec, rows, key, measure in ((ORDERS, composite, [0, 1], 3), (events, single, [0], 1)):
        if by == "rows":
            marker = stage(wh, f"run-{spec.name}", rows, spec=spec)
        else:
            marker = stage_as_select(wh, spec, f"run-{spec.name}", rows)
        wh.publish(spec_or_name=spec, partition=DAY, run_id=f"run-{spec.name}", expected_run_id=None, actor="owner")
        published = as_tuples(wh.read_partition(spec.name, DAY), spec)

        assert len(published) == len(rows)
        assert (marker.row_count, marker.null_keys, marker.distinct_keys, marker.measure_sum) == \
            _counted(published, key, measure) == _counted(rows, key, measure)
        assert marker.fingerprint == wh.fingerprint(spec=spec, run_id=f"run-{spec.name}")


def test_numbers_are_counted_again_when_the_marker_lacks_them_or_the_key_changed(wh):
    rows = order_rows(20)
    stage(wh, "run-old", rows + [rows[0]])
    stage(wh, "run-new", rows)
    needs_sql_layout(wh)
    # A marker from before markers kept numbers.
    wh.execute('UPDATE "_bf_markers" SET "null_keys" = NULL, "distinct_keys" = NULL, "measure_sum" = NULL, '
                  '"numbers_of" = NULL WHERE "run_id" = ?', ("run-old",))
    old = wh.profile(spec=ORDERS, run_id="run-old")
    assert (old.row_count, old.distinct_keys, old.duplicate_keys) == (21, 20, 1)
    assert old.measure_sum == pytest.approx(float(sum(r[3] for r in rows) + rows[0][3]))

    # The catalog now keys the dataset by order alone: 7 orders of up to 3 lines.
    by_order = DatasetSpec(name="orders", columns=ORDERS.columns, business_key=("order_id",), core_measure="amount")
    new = wh.profile(spec=by_order, run_id="run-new")
    assert (new.row_count, new.distinct_keys, new.duplicate_keys) == (20, 7, 13)


def test_an_older_marker_table_gains_the_number_columns(backend_url):
    old = make_warehouse(backend_url)
    needs_sql_layout(old)
    ts = "timestamp with time zone" if old.dialect == "postgresql" else "TEXT"
    old.execute(f"""CREATE TABLE "_bf_markers" ("run_id" TEXT PRIMARY KEY, "attempt_no" INTEGER NOT NULL,
        "dataset" TEXT NOT NULL, "partition" TEXT NOT NULL, "row_count" INTEGER NOT NULL,
        "fingerprint" TEXT NOT NULL, "committed_at" {ts} NOT NULL)""")
    old.close()
    wh = make_warehouse(backend_url)

    wh.ensure_meta()
    marker = stage(wh, "run-1", order_rows(5))

    assert wh.marker("run-1") == marker and marker.distinct_keys == 5
    assert make_warehouse(backend_url).profile(spec=ORDERS, run_id="run-1").distinct_keys == 5


def test_many_profiles_come_from_markers_and_agree_with_counting(wh):
    rows = order_rows(40)
    staged = {"run-a": rows, "run-b": rows + rows[:3] + [(None,) + rows[5][1:]], "run-c": rows[:10]}
    for run_id, version in staged.items():
        stage(wh, run_id, version)
    needs_sql_layout(wh)
    wh.execute('UPDATE "_bf_markers" SET "distinct_keys" = NULL WHERE "run_id" = ?', ("run-c",))

    numbers = wh.profile_many(spec=ORDERS, run_ids=["run-a", "run-b", "run-c", "run-none"])

    assert set(numbers) == {"run-a", "run-b", "run-c"}
    for run_id, got in numbers.items():
        # Counted here, from the rows staged: (order_id, line_no) is the key, amount the measure.
        keys = [(r[0], r[1]) for r in staged[run_id]]
        complete = [k for k in keys if None not in k]
        assert (got.row_count, got.null_keys, got.distinct_keys) == (len(keys), len(keys) - len(complete),
                                                                     len(set(complete)))
        assert got.measure_sum == pytest.approx(sum(float(r[3]) for r in staged[run_id]))
    assert numbers["run-b"].duplicate_keys == 3
    assert wh.measure_many(spec=ORDERS, run_ids=["run-a", "run-c"]) == {
        "run-a": numbers["run-a"].measure_sum, "run-c": numbers["run-c"].measure_sum}


# -- schema ---------------------------------------------------------------------------------


def test_ensure_dataset_is_idempotent_and_adds_a_new_column_without_losing_old_versions(wh):
    wh.ensure_dataset(ORDERS)
    wh.ensure_dataset(ORDERS)
    stage(wh, "run-old", order_rows(5))
    publish(wh, "run-old", None)
    widened = DatasetSpec(name="orders", columns=ORDERS.columns + (ColumnSpec("channel", "text"),),
                          business_key=ORDERS.business_key, core_measure="amount")

    wh.ensure_dataset(widened)
    assert {r["channel"] for r in wh.read_partition("orders", DAY)} == {None}

    wh.stage_rows(spec=widened, run_id="run-new", attempt_no=1, partition=DAY,
                  rows=[r + ("web",) for r in order_rows(5)])
    publish(wh, "run-new", "run-old")
    assert {r["channel"] for r in wh.read_partition("orders", DAY)} == {"web"}

    # A process still on the old spec neither fails nor takes the column away.
    make_warehouse(wh.url).ensure_dataset(ORDERS)
    assert {r["channel"] for r in wh.read_partition("orders", DAY)} == {"web"}
    assert wh.profile(spec=widened, run_id="run-new").columns[-1] == ("channel", "text")


def test_a_fresh_adapter_reads_an_existing_warehouse_without_a_write_transaction(wh, monkeypatch):
    """Each process makes its own backend; on SQLite a needless DDL transaction would
    take the single write lock for what is only a read."""
    needs_sql_layout(wh)
    stage(wh, "run-a", order_rows(5))
    publish(wh, "run-a", None)
    opened = []
    fresh = make_warehouse(wh.url)
    real_transaction = fresh.transaction

    def counting_transaction():
        opened.append(True)
        return real_transaction()

    monkeypatch.setattr(fresh, "transaction", counting_transaction)

    fresh.current("orders", DAY)
    fresh.history("orders", DAY)
    fresh.profile(spec=ORDERS, run_id="run-a")
    fresh.read_partition("orders", DAY)

    assert opened == []


def test_ensure_dataset_refuses_to_change_a_column_type(wh):
    wh.ensure_dataset(ORDERS)
    retyped = DatasetSpec(name="orders", columns=(("order_id", "integer"),) + ORDERS.columns[1:],
                          business_key=ORDERS.business_key)

    with pytest.raises(ValidationError, match="order_id"):
        make_warehouse(wh.url).ensure_dataset(retyped)


def test_current_many_answers_for_published_partitions_only(wh):
    stage(wh, "run-a", order_rows(5))
    stage(wh, "run-b", order_rows(5), partition=NEXT_DAY)
    stage(wh, "run-c", order_rows(5), partition="2024-03-03")
    publish(wh, "run-a", None)
    publish(wh, "run-b", None, partition=NEXT_DAY)

    assert wh.current_many("orders", [DAY, NEXT_DAY, "2024-03-03", "2024-03-04"]) == {DAY: "run-a", NEXT_DAY: "run-b"}
    assert wh.current_many("orders", []) == {}


@pytest.mark.parametrize(
    "build",
    [
        lambda: DatasetSpec(name="orders; drop table x", columns=(("a", "text"),), business_key=("a",)),
        lambda: DatasetSpec(name="orders\n", columns=(("a", "text"),), business_key=("a",)),
        lambda: DatasetSpec(name="_bf_current", columns=(("a", "text"),), business_key=("a",)),
        lambda: DatasetSpec(name="orders", columns=(("a", "text"),), business_key=("b",)),
        lambda: DatasetSpec(name="orders", columns=(("a", "text"),), business_key=()),
        lambda: DatasetSpec(name="orders", columns=(("a", "text"),), business_key=("a",), core_measure="a"),
        lambda: ColumnSpec('a"b', "text"),
        lambda: ColumnSpec("_run_id", "text"),
        lambda: ColumnSpec("a", "varchar"),
    ],
    ids=[
        "sql-in-name", "trailing-newline", "meta-name", "key-not-a-column", "no-key", "text-measure",
        "quote", "reserved", "bad-type",
    ],
)
def test_specs_refuse_unsafe_or_meaningless_definitions(build):
    with pytest.raises(ValidationError):
        build()
