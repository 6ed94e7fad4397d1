"""PostgreSQL's own guarantees beyond the contract: a frozen writer holds nothing for
ever (advisory locks a retry may take over, the lock and idle-in-transaction timeouts)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psycopg
import pytest

from backfill_portal.backends import WarehouseLockTimeout, WarehouseUnavailable, make_warehouse
from tests.backends.test_contract import (
    DAY,
    ORDERS,
    PROJECT_ROOT,
    count_version_rows,
    order_rows,
    stage,
)

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
    proc = subprocess.Popen([sys.executable, "-c", FROZEN_STAGER, pg_wh_url], cwd=PROJECT_ROOT,
                            env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.strip() == "holding", f"the writer did not start: {line!r} {proc.stderr.read()}"
    os.kill(proc.pid, signal.SIGSTOP)
    yield proc
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
    proc.wait(timeout=30)


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
