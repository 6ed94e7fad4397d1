"""What the Iceberg warehouse (docs/iceberg.md) shows beyond the contract suite, which
runs on it too (test_contract.py, `iceberg` and `iceberg-postgresql`): a table the portal
published, read back by pyiceberg alone in another process, is exactly the version the
portal reports, and after a rollback the previous one; history survives a crash between
the Iceberg commit and its row; retention deletes only files no retained snapshot or
version needs; the orphan sweep never touches a live writer's files. Each on a local
warehouse and on one in a bucket of an S3 API server (moto's)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from datetime import date, datetime
from pathlib import Path

import pytest
import sqlalchemy

from backfill_portal.backends import WarehouseUnavailable, make_warehouse
from backfill_portal.core.errors import ValidationError
from tests.backends.test_contract import DAY, NEXT_DAY, ORDERS, count_written_rows, order_rows, publish, stage

PROJECT_ROOT = Path(__file__).resolve().parents[2]

READ_BACK = textwrap.dedent(
    """
    import json, sys
    from pyiceberg.catalog.sql import SqlCatalog

    name, uri, warehouse, table_name, partition, properties = sys.argv[1:7]
    table = SqlCatalog(name, uri=uri, warehouse=warehouse, **json.loads(properties)).load_table(table_name)
    rows = table.scan(row_filter=f"_partition = '{partition}'").to_arrow().to_pylist()
    print(json.dumps(rows, default=lambda v: v.isoformat()))
    """
)


@pytest.fixture(params=["local", "s3"])
def wh(request, tmp_path):
    """An Iceberg warehouse with its files under tmp_path, or in a bucket of an S3 API server."""
    if request.param == "s3":
        from tests.conftest import iceberg_s3_url

        url = iceberg_s3_url(tmp_path, request.getfixturevalue("s3_endpoint"))
    else:
        url = f"iceberg+sqlite:///{tmp_path / 'catalog.db'}?warehouse={tmp_path / 'iceberg'}"
    warehouse = make_warehouse(url)
    yield warehouse
    warehouse.close()


def read_back(wh, partition: str = DAY) -> list[dict]:
    """The partition as pyiceberg alone reads it, in a process of its own (no portal code)."""
    done = subprocess.run(
        [sys.executable, "-c", READ_BACK, wh.catalog_name, wh.catalog_uri, wh.warehouse_uri, f"{wh.namespace}.orders",
         partition, json.dumps(wh.io_properties)],
        capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": ""}, cwd="/")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def as_rows(dicts: list[dict]) -> list[tuple]:
    """Read-back rows in ORDERS' column order, as Python values again."""
    return [(d["order_id"], d["line_no"], d["customer"], d["amount"], datetime.fromisoformat(d["created_at"]),
             date.fromisoformat(d["day"]), d["paid"]) for d in dicts]


def test_pyiceberg_in_another_process_reads_exactly_the_published_version_and_after_a_rollback_the_previous(wh):
    rows = order_rows(200)
    first = stage(wh, "run-first", rows)
    second = stage(wh, "run-second", rows[:150] + order_rows(30, seed=7))
    stage(wh, "run-other-day", order_rows(20), partition=NEXT_DAY)
    publish(wh, "run-first", None)
    publish(wh, "run-other-day", None, partition=NEXT_DAY)
    publish(wh, "run-second", "run-first")

    for i, (expected, run_id) in enumerate([(second, "run-second"), (first, "run-first")]):
        if i == 1:
            wh.rollback(name="orders", partition=DAY, to_run_id="run-first", expected_run_id="run-second",
                        actor="oncall")
        seen = read_back(wh)
        reported = wh.profile(spec=ORDERS, run_id=wh.current("orders", DAY))

        assert {r["_run_id"] for r in seen} == {run_id}
        keys = {(r["order_id"], r["line_no"]) for r in seen}
        assert (len(seen), len(keys)) == (reported.row_count, reported.distinct_keys) == (expected.row_count,
                                                                                              expected.distinct_keys)
        assert sum(r["amount"] for r in seen) == pytest.approx(reported.measure_sum)
        # The fingerprint of what pyiceberg read, taken by the portal's own staging, is the version's.
        again = stage(wh, f"read-back-{i}", as_rows(seen))
        assert again.fingerprint == reported.fingerprint == expected.fingerprint


def test_history_is_rebuilt_from_the_snapshots_when_the_committer_died_before_writing_its_row(wh):
    stage(wh, "run-a", order_rows(5))
    stage(wh, "run-b", order_rows(5, seed=1))
    publish(wh, "run-a", None, actor="alice")
    record = publish(wh, "run-b", "run-a", actor="bob")
    with wh.engine.begin() as conn:  # the publisher of run-b was killed right after its Iceberg commit
        conn.execute(sqlalchemy.text("DELETE FROM bf_ice_publications WHERE run_id = 'run-b'"))

    history = make_warehouse(wh.url).history("orders", DAY)

    assert [(r.run_id, r.previous_run_id, r.actor, r.action) for r in history] == [
        ("run-b", "run-a", "bob", "publish"), ("run-a", None, "alice", "publish")]
    assert history[0].published_at == record.published_at


def test_purge_keeps_every_file_a_retained_version_or_snapshot_needs(wh):
    for run_id, seed in [("run-a", 0), ("run-b", 1), ("run-c", 2)]:
        stage(wh, run_id, order_rows(20, seed=seed))
    publish(wh, "run-a", None)
    publish(wh, "run-b", "run-a")
    publish(wh, "run-c", "run-b")
    purged_files = wh.run_files(ORDERS, "run-a")

    assert wh.purge(spec=ORDERS, run_id="run-a") == 20

    assert purged_files and not any(wh.storage.exists(p) for p in purged_files)
    table = wh.catalog.load_table(f"{wh.namespace}.orders")
    for snapshot in table.snapshots():  # every snapshot Iceberg still offers is readable
        for task in table.scan(snapshot_id=snapshot.snapshot_id).plan_files():
            assert wh.storage.exists(wh.storage.engine_path(task.file.file_path))
    assert all(wh.storage.exists(p) for run in ("run-b", "run-c") for p in wh.run_files(ORDERS, run))
    wh.rollback(name="orders", partition=DAY, to_run_id="run-b", expected_run_id="run-c", actor="oncall")
    assert {r["_run_id"] for r in read_back(wh)} == {"run-b"}


def live_manifests(wh) -> int:
    """The manifests a reader of the table plans over (its current snapshot's list)."""
    table = wh.catalog.load_table(f"{wh.namespace}.orders")
    return len(table.current_snapshot().manifests(table.io))


def test_readers_plan_over_as_many_manifests_after_25_publishes_as_after_2_and_old_snapshots_expire(wh):
    from backfill_portal.backends.iceberg import RETAINED_SNAPSHOTS

    stage(wh, "run-other-day", order_rows(10), partition=NEXT_DAY)
    publish(wh, "run-other-day", None, partition=NEXT_DAY)
    previous = None
    for i in range(25):
        stage(wh, f"run-{i}", order_rows(10, seed=i))
        publish(wh, f"run-{i}", previous, actor=f"user-{i}")
        previous = f"run-{i}"
        if i == 1:
            after_two = live_manifests(wh)
        if i == 3:  # this publisher dies between its Iceberg commit and its history row
            with wh.engine.begin() as conn:
                conn.execute(sqlalchemy.text("DELETE FROM bf_ice_publications WHERE run_id = 'run-3'"))

    assert live_manifests(wh) == after_two <= 4
    table = wh.catalog.load_table(f"{wh.namespace}.orders")
    assert len(table.snapshots()) == RETAINED_SNAPSHOTS
    for snapshot in table.snapshots():  # every snapshot still offered is readable
        for task in table.scan(snapshot_id=snapshot.snapshot_id).plan_files():
            assert wh.storage.exists(wh.storage.engine_path(task.file.file_path))
    # The history outlives the snapshots, the row the dead publisher missed included.
    history = make_warehouse(wh.url).history("orders", DAY)
    assert [(r.run_id, r.actor) for r in history] == [(f"run-{i}", f"user-{i}") for i in reversed(range(25))]
    # Rolling back to the first version, whose snapshot is long expired, finds its files.
    wh.rollback(name="orders", partition=DAY, to_run_id="run-0", expected_run_id="run-24", actor="oncall")
    seen = read_back(wh)
    assert {r["_run_id"] for r in seen} == {"run-0"}
    assert stage(wh, "read-back", as_rows(seen)).fingerprint == wh.marker("run-0").fingerprint
    assert {r["_run_id"] for r in read_back(wh, NEXT_DAY)} == {"run-other-day"}
    assert live_manifests(wh) == after_two


def test_a_snapshot_a_reader_tagged_outlives_the_expiry_and_publishing_goes_on(wh):
    from backfill_portal.backends.iceberg import RETAINED_SNAPSHOTS

    stage(wh, "run-0", order_rows(10))
    publish(wh, "run-0", None)
    table = wh.catalog.load_table(f"{wh.namespace}.orders")
    tagged = table.current_snapshot().snapshot_id
    table.manage_snapshots().create_tag(tagged, "audit-2024").commit()
    for i in range(1, RETAINED_SNAPSHOTS + 3):
        stage(wh, f"run-{i}", order_rows(10, seed=i))
        assert publish(wh, f"run-{i}", f"run-{i - 1}").run_id == f"run-{i}"

    table = wh.catalog.load_table(f"{wh.namespace}.orders")
    assert tagged in {s.snapshot_id for s in table.snapshots()}
    assert len(table.snapshots()) == RETAINED_SNAPSHOTS + 1
    assert {r["_run_id"] for r in table.scan(snapshot_id=tagged).to_arrow().to_pylist()} == {"run-0"}


def test_the_orphan_sweep_leaves_a_live_writer_alone(wh):
    wh.ensure_dataset(ORDERS)
    halfway = threading.Event()
    go_on = threading.Event()

    def rows():
        for i, row in enumerate(order_rows(300)):
            if i == 200:
                halfway.set()
                go_on.wait(60)
            yield row

    result = []
    writer = threading.Thread(target=lambda: result.append(
        stage(wh, "run-live", rows(), chunk_size=100)))
    writer.start()
    try:
        assert halfway.wait(60)
        assert wh.sweep_orphans(ORDERS) == []
        assert count_written_rows(wh, "run-live") == 200
    finally:
        go_on.set()
        writer.join(60)

    assert result and result[0].row_count == 300
    assert wh.sweep_orphans(ORDERS) == []  # committed: not an orphan either


def test_warehouse_urls_are_checked_in_one_line(tmp_path):
    with pytest.raises(ValidationError, match="iceberg\\+mysql"):
        make_warehouse("iceberg+mysql://h/d")
    with pytest.raises(ValidationError, match="warehouse=<path> is required"):
        make_warehouse("iceberg+postgresql://h/d")
    with pytest.raises(ValidationError, match="not a local path or an object store this backend reaches"):
        make_warehouse(f"iceberg+sqlite:///{tmp_path / 'c.db'}?warehouse=gs://bucket/wh")
    with pytest.raises(ValidationError, match="names no bucket"):
        make_warehouse(f"iceberg+sqlite:///{tmp_path / 'c.db'}?warehouse=s3:///wh")
    with pytest.raises(WarehouseUnavailable):
        make_warehouse(f"iceberg+sqlite:///{tmp_path / 'missing' / 'c.db'}").probe(timeout=2)
    make_warehouse(f"iceberg+sqlite:///{tmp_path / 'c.db'}").probe(timeout=2)
    assert not (tmp_path / "c.db").exists() or (tmp_path / "c.db").stat().st_size == 0


def test_a_source_keeps_its_newest_snapshots_and_loses_only_the_files_a_replace_left(wh):
    from backfill_portal.backends.iceberg import RETAINED_SNAPSHOTS, SOURCE_EXPIRY_BATCH
    from tests.backends.test_sources import EVENTS, read, rows

    def live_files() -> list[str]:
        table = wh.catalog.load_table(f"{wh.namespace}.{EVENTS.name}")
        return [wh.storage.engine_path(t.file.file_path) for t in table.scan().plan_files()]

    wh.load_source(spec=EVENTS, rows=rows(50), time_column="event_time", load_key="first")
    replaced = live_files()
    wh.load_source(spec=EVENTS, rows=rows(40, start=1000), time_column="event_time", load_key="again", replace=True)
    loads = RETAINED_SNAPSHOTS + SOURCE_EXPIRY_BATCH
    for i in range(loads):
        wh.load_source(spec=EVENTS, rows=rows(1, start=2000 + i), time_column="event_time", load_key=f"k{i}")

    table = wh.catalog.load_table(f"{wh.namespace}.{EVENTS.name}")
    assert RETAINED_SNAPSHOTS <= len(table.snapshots()) < RETAINED_SNAPSHOTS + SOURCE_EXPIRY_BATCH
    assert replaced and not any(wh.storage.exists(f) for f in replaced)
    for snapshot in table.snapshots():  # every snapshot still offered is readable
        for task in table.scan(snapshot_id=snapshot.snapshot_id).plan_files():
            assert wh.storage.exists(wh.storage.engine_path(task.file.file_path))
    assert all(wh.storage.exists(f) for f in live_files())
    assert [r[0] for r in read(wh)] == [f"e{i:05d}" for i in [*range(1000, 1040), *range(2000, 2000 + loads)]]
    assert set(wh.source_loads(EVENTS.name)) == {"again", *(f"k{i}" for i in range(loads))}


def test_an_object_store_warehouse_is_ready_only_when_its_bucket_answers(tmp_path, s3_endpoint):
    from tests.conftest import iceberg_s3_url

    url = iceberg_s3_url(tmp_path, s3_endpoint)
    make_warehouse(url).probe(timeout=2)
    with pytest.raises(WarehouseUnavailable, match="does not exist"):
        make_warehouse(url.replace("warehouse=s3://", "warehouse=s3://missing-")).probe(timeout=2)
    with pytest.raises(WarehouseUnavailable):  # nothing listens there
        make_warehouse(url.replace(s3_endpoint, "http://127.0.0.1:9")).probe(timeout=2)
    with pytest.raises(ValidationError, match="writer_lease=0 must be seconds"):
        make_warehouse(url.replace("writer_lease=2", "writer_lease=0"))


def test_an_unreachable_catalog_is_named_without_its_password():
    wh = make_warehouse("iceberg+postgresql://portal:s3cret-pw@127.0.0.1:9/catalog?warehouse=/tmp/unused")
    with pytest.raises(WarehouseUnavailable) as caught:
        wh.probe(timeout=1)
    assert "s3cret-pw" not in str(caught.value) and "portal:***@127.0.0.1:9/catalog" in str(caught.value)


def test_an_attempt_taken_over_on_an_object_store_stops_before_its_marker(tmp_path, s3_endpoint):
    from backfill_portal.backends import WarehouseLockTimeout
    from tests.conftest import iceberg_s3_url

    wh = make_warehouse(iceberg_s3_url(tmp_path, s3_endpoint))
    wh.ensure_dataset(ORDERS)
    halfway, go_on = threading.Event(), threading.Event()

    def frozen_rows():
        for i, row in enumerate(order_rows(300)):
            if i == 200:
                halfway.set()
                go_on.wait(60)
            yield row

    outcome = []

    def first_attempt():
        try:
            outcome.append(stage(wh, "run-x", frozen_rows(), chunk_size=100))
        except WarehouseLockTimeout as exc:
            outcome.append(exc)

    frozen = threading.Thread(target=first_attempt)
    frozen.start()
    try:
        assert halfway.wait(60)
        second = stage(wh, "run-x", order_rows(50, seed=3), attempt_no=2, take_over=True)
    finally:
        go_on.set()
        frozen.join(60)

    assert isinstance(outcome[0], WarehouseLockTimeout)
    assert wh.marker("run-x").attempt_no == second.attempt_no == 2
    assert wh.marker("run-x").row_count == 50
    assert count_written_rows(wh, "run-x") == 50  # the version is the second attempt's files alone
    wh.close()
