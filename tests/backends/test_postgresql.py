"""PostgreSQL's own guarantees beyond the contract: a frozen writer holds nothing for
ever (advisory locks a retry may take over, the lock and idle-in-transaction timeouts)."""
from __future__ import annotations

import dataclasses
import os
import signal
import textwrap
import threading
import time

import psycopg
import pytest
from django.conf import settings

from backfill_portal.backends import WarehouseLockTimeout, WarehouseUnavailable, make_warehouse
from tests.backends.test_contract import (
    DAY,
    NEXT_DAY,
    ORDERS,
    PROJECT_ROOT,
    count_version_rows,
    order_rows,
    publish,
    stage,
)
from tests.conftest import frozen_once_holding

# -- a frozen writer holds nothing for ever (PostgreSQL) ----------------------------------

FROZEN_STAGER = textwrap.dedent(
    """
    import sys
    from backfill_portal.backends import make_warehouse
    from tests.backends.test_contract import DAY, ORDERS, order_rows

    wh = make_warehouse(sys.argv[1])

    def rows():
        for i, row in enumerate(order_rows(100)):
            if i == 50:
                print("holding", flush=True)
                sys.stdin.readline()  # frozen inside its staging transaction until told
            yield row

    try:
        wh.stage_rows(spec=ORDERS, run_id="run-frozen", attempt_no=1, partition=DAY, rows=rows(), chunk_size=10)
        print("committed", flush=True)
    except Exception as exc:
        print("refused:", type(exc).__name__, flush=True)
    """
)


@pytest.fixture
def pg_wh_url(pg_url):
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("DROP SCHEMA public CASCADE")
        conn.execute("CREATE SCHEMA public")
    make_warehouse(pg_url).ensure_dataset(ORDERS)
    return pg_url


@pytest.fixture
def frozen_stager(pg_wh_url):
    """A writer stopped (SIGSTOP) in the middle of staging run-frozen, holding its lock."""
    with frozen_once_holding(["-c", FROZEN_STAGER, pg_wh_url], cwd=PROJECT_ROOT,
                             env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}) as proc:
        yield proc


@pytest.mark.postgres
def test_a_retry_taking_over_ends_the_frozen_writers_session_and_stages_alone(pg_wh_url, frozen_stager):
    wh = make_warehouse(pg_wh_url, lock_timeout_seconds=30)
    marker = stage(wh, "run-frozen", order_rows(100), attempt_no=2, take_over=True)
    assert (marker.attempt_no, marker.row_count) == (2, 100)
    os.kill(frozen_stager.pid, signal.SIGCONT)
    out, _ = frozen_stager.communicate("\n", timeout=30)
    assert out.strip() == "refused: WarehouseUnavailable"  # its session is gone, its rows with it
    assert count_version_rows(wh, "run-frozen") == 100
    assert wh.marker("run-frozen").attempt_no == 2


@pytest.mark.postgres
def test_without_taking_over_the_wait_for_a_frozen_writers_lock_is_bounded(pg_wh_url, frozen_stager):
    wh = make_warehouse(pg_wh_url, lock_timeout_seconds=1)
    with pytest.raises(WarehouseLockTimeout, match="lock timeout"):
        stage(wh, "run-frozen", order_rows(100), attempt_no=2)
    assert wh.marker("run-frozen") is None  # nothing half-written
    assert stage(wh, "run-other", order_rows(10)).row_count == 10  # the session is still usable


@pytest.mark.postgres
def test_a_session_left_idle_in_a_transaction_is_ended_by_the_server(pg_wh_url):
    wh = make_warehouse(pg_wh_url, idle_in_transaction_timeout_seconds=1)
    with pytest.raises(WarehouseUnavailable):
        with wh.transaction():
            wh.execute('CREATE TABLE "idle_probe" AS SELECT 1 AS x')
            time.sleep(2.5)  # a client that stopped talking inside its transaction
            wh.query("SELECT 1")
    assert not wh.table_exists("idle_probe")  # rolled back by the server


@pytest.mark.postgres
def test_a_session_whose_peer_is_gone_is_ended_by_the_servers_keepalives(pg_wh_url):
    """A worker host cut off in the middle of staging holds its staging lock: the
    server's keepalives (DATABASE_DEAD_PEER_SECONDS) end the session long before the
    idle timeout would."""
    rows = make_warehouse(pg_wh_url).query(
        "SELECT name, setting::int FROM pg_settings WHERE name LIKE 'tcp_keepalives%'")
    assert settings.DATABASE_DEAD_PEER_SETTINGS
    assert dict(rows) == settings.DATABASE_DEAD_PEER_SETTINGS


# -- a version made by its SELECT (CREATE TABLE ... AS) -----------------------------------

@pytest.mark.postgres
def test_a_version_made_by_its_select_has_the_reader_tables_columns_and_attaches(pg_wh_url):
    """stage_select creates the version's table from the SELECT: a text the SELECT gives
    in another collation, a number of a narrower type and a column the catalog no
    longer declares still make the reader table's columns, so the publish attaches it
    and readers see its rows."""
    wh = make_warehouse(pg_wh_url)
    source = stage(wh, "run-src", order_rows(30), partition=NEXT_DAY)
    without_paid = dataclasses.replace(ORDERS, columns=tuple(c for c in ORDERS.columns if c.name != "paid"))
    pinned = wh.ref_sql(spec=ORDERS, pins={NEXT_DAY: "run-src"})
    marker = wh.stage_select(
        spec=without_paid, run_id="run-1", attempt_no=1, partition=DAY,
        select_sql=(f'SELECT order_id COLLATE "C" AS order_id, CAST(line_no AS smallint) AS line_no, '
                    f"customer, amount, created_at, day FROM {pinned} AS s"))

    table = wh.version_table(ORDERS, "run-1")
    columns = wh.query("SELECT attname, format_type(atttypid, atttypmod), attcollation::regcollation::text "
                       "FROM pg_attribute WHERE attrelid = to_regclass(?) AND attnum > 0 AND NOT attisdropped "
                       "AND attname NOT LIKE '\\_%' ORDER BY attnum", (f'"{table}"',))
    reader = wh.query("SELECT attname, format_type(atttypid, atttypmod), attcollation::regcollation::text "
                      "FROM pg_attribute WHERE attrelid = 'orders'::regclass AND attnum > 0 AND NOT attisdropped "
                      "AND attname NOT LIKE '\\_%' ORDER BY attnum")
    assert [tuple(c) for c in columns] == [tuple(c) for c in reader]
    assert marker.row_count == 30
    publish(wh, "run-1", None)
    rows = wh.query('SELECT order_id, line_no, paid FROM "orders" ORDER BY order_id, line_no')
    assert [(r[0], r[1]) for r in rows] == sorted((r[0], r[1]) for r in order_rows(30))
    assert {r[2] for r in rows} == {None}  # the column the SELECT did not give
    assert source.row_count == 30


# -- a publish beside long readers (issue #15) --------------------------------------------

LOCK_TIMEOUT = 1.0  # WAREHOUSE_PUBLISH_LOCK_TIMEOUT_SECONDS for these tests
# A reader arriving while a publish waits queues behind it for at most the lock
# timeout; this much more is the shared machine's scheduling and the query itself.
SLACK = 0.75


@pytest.mark.postgres
def test_a_publish_during_a_30_second_reader_waits_for_it_without_blocking_later_readers(pg_wh_url):
    """The reader sees one version throughout; the publish (replacing a version takes an
    ACCESS EXCLUSIVE lock on the reader table) completes after it, retrying; readers
    that start meanwhile wait no longer than the publish lock timeout each."""
    wh = make_warehouse(pg_wh_url, publish_lock_timeout_seconds=LOCK_TIMEOUT, publish_wait_seconds=120)
    stage(wh, "run-a", order_rows(100))
    stage(wh, "run-b", order_rows(60, seed=5))
    publish(wh, "run-a", None)
    long_read: dict = {}
    published: dict = {}

    def long_reader():
        with psycopg.connect(pg_wh_url, autocommit=True) as conn:
            long_read["start"] = time.monotonic()
            # 100 rows, 0.3 s each: one 30-second statement over the partition.
            rows = conn.execute('SELECT "_run_id", pg_sleep(0.3) FROM "orders" WHERE "_partition" = %s',
                                (DAY,)).fetchall()
            long_read["end"] = time.monotonic()
            long_read["runs"] = [r[0] for r in rows]

    def publisher():
        try:
            published["record"] = publish(wh, "run-b", "run-a")
        except Exception as exc:  # asserted on below
            published["error"] = exc
        finally:
            published["end"] = time.monotonic()
            wh.close()

    reader = threading.Thread(target=long_reader)
    reader.start()
    with psycopg.connect(pg_wh_url, autocommit=True) as watch:
        while not watch.execute("SELECT 1 FROM pg_stat_activity WHERE query LIKE %s AND state = 'active'",
                                ('%pg_sleep(0.3)%',)).fetchall():
            time.sleep(0.05)
    publishing = threading.Thread(target=publisher)
    publishing.start()
    waits, seen = [], []
    with psycopg.connect(pg_wh_url, autocommit=True) as conn:
        while reader.is_alive() and len(waits) < 60:
            time.sleep(0.4)
            t = time.monotonic()
            count, low, high = conn.execute('SELECT COUNT(*), MIN("_run_id"), MAX("_run_id") FROM "orders" '
                                            'WHERE "_partition" = %s', (DAY,)).fetchone()
            waits.append(time.monotonic() - t)
            seen.append((count, low, high))
    reader.join(timeout=60)
    publishing.join(timeout=120)

    assert long_read["end"] - long_read["start"] >= 29
    assert set(long_read["runs"]) == {"run-a"} and len(long_read["runs"]) == 100  # one version throughout
    assert "error" not in published, published.get("error")
    assert published["end"] >= long_read["end"]  # it waited for the reader...
    assert published["record"].run_id == "run-b" and wh.current("orders", DAY) == "run-b"
    # ...and the readers started meanwhile were never held longer than the lock timeout.
    assert len(waits) >= 20
    assert max(waits) <= LOCK_TIMEOUT + SLACK, sorted(waits)[-5:]
    # Each saw one whole version: run-a, or run-b once the publish went through.
    assert (100, "run-a", "run-a") in seen and set(seen) <= {(100, "run-a", "run-a"), (60, "run-b", "run-b")}


@pytest.mark.postgres
def test_a_publish_that_cannot_get_the_readers_lock_in_time_changes_nothing(pg_wh_url):
    wh = make_warehouse(pg_wh_url, publish_lock_timeout_seconds=0.2, publish_wait_seconds=1.5)
    stage(wh, "run-a", order_rows(10))
    stage(wh, "run-b", order_rows(10, seed=1))
    publish(wh, "run-a", None)
    with psycopg.connect(pg_wh_url) as reader:  # a reader holding its transaction open
        reader.execute('SELECT COUNT(*) FROM "orders"').fetchall()
        with pytest.raises(WarehouseLockTimeout):
            publish(wh, "run-b", "run-a")
        assert wh.current("orders", DAY) == "run-a"
        assert [r.run_id for r in wh.history("orders", DAY)] == ["run-a"]
    publish(wh, "run-b", "run-a")  # the reader gone, it goes through
    assert {r["_run_id"] for r in wh.read_partition("orders", DAY)} == {"run-b"}


@pytest.mark.postgres
def test_attaching_a_published_version_does_not_scan_it(pg_wh_url):
    """The version's CHECK, validated as its rows went in, proves the partition
    constraint: PostgreSQL says so (DEBUG1) instead of scanning under its lock."""
    wh = make_warehouse(pg_wh_url)
    stage(wh, "run-a", order_rows(50))
    stage(wh, "run-b", order_rows(50, seed=2))
    publish(wh, "run-a", None)
    notices: list[str] = []
    wh.conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
    wh.execute("SET client_min_messages = debug1")

    publish(wh, "run-b", "run-a")

    table = wh.version_table(ORDERS, "run-b")
    assert any(f'partition constraint for table "{table}" is implied by existing constraints' in n
               for n in notices), notices


# -- the fingerprint's definition stays the stored markers' -------------------------------


def test_the_fingerprint_is_the_sum_of_rounded_row_hashes(pg_wh_url):
    """A fingerprint of kind "v2" is the sum, modulo 2**64, of hash_record_extended over
    the rows with every numeric rounded to the sixth decimal. The marker's scan skips the
    round for a value with at most six decimals and may sum in parallel workers: it must
    still give that sum, for values with fewer decimals, trailing zeros and more than
    six, and so must `fingerprint`."""
    from decimal import Decimal

    wh = make_warehouse(pg_wh_url)
    amounts = [Decimal("1"), Decimal("0.30"), Decimal("0.3000004"), Decimal("-2.1234567"), Decimal("12.5"),
               Decimal("0.1234565"), None]
    rows = [r[:3] + (amount,) + r[4:] for r, amount in zip(order_rows(len(amounts)), amounts)]
    marker = stage(wh, "run-1", rows)
    values = ", ".join(f'round("{c.name}", 6)' if c.type == "numeric" else f'"{c.name}"' for c in ORDERS.columns)
    (total,) = wh.query(f'SELECT SUM(hash_record_extended(ROW({values}), 0)) FROM "{wh.version_table(ORDERS, "run-1")}"')[0]

    assert marker.fingerprint == f"v2:{int(total) % 2**64:016x}"
    assert marker.fingerprint == wh.fingerprint(spec=ORDERS, run_id="run-1")


def test_a_marker_of_an_earlier_fingerprint_kind_is_fingerprinted_again_when_profiled(pg_wh_url):
    """A version staged before the fingerprint became "v2" keeps its marker's bare-hex
    fingerprint; `profile`, which verification compares, gives today's kind for it, so
    it equals a version of the same rows staged now (and differs from other rows')."""
    wh = make_warehouse(pg_wh_url)
    stage(wh, "run-old", order_rows(20))
    stage(wh, "run-new", order_rows(20))
    stage(wh, "run-other", order_rows(20, seed=2))
    wh.execute("""UPDATE "_bf_markers" SET "fingerprint" = '0123456789abcdef0123456789abcdef' WHERE "run_id" = ?""",
               ("run-old",))
    assert wh.marker("run-old").fingerprint == "0123456789abcdef0123456789abcdef"

    old, new, other = (wh.profile(spec=ORDERS, run_id=r).fingerprint for r in ("run-old", "run-new", "run-other"))

    assert old == new and old.startswith("v2:")
    assert other != new
