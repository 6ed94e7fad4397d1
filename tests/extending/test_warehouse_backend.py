"""docs/extending.md, "A warehouse backend": `sqlite_logged.py` adds a backend in one file
with one registration; it passes the whole contract suite and is chosen by its scheme."""
from __future__ import annotations

import logging

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from backfill_portal.backends import backend_class, check_warehouse_url, get_warehouse, reset_warehouse_cache
from backfill_portal.core.errors import ValidationError
from tests.backends.test_contract import *  # noqa: F401,F403 - the contract's tests, run here
from tests.backends.test_contract import DAY, ORDERS, order_rows, publish, stage
from tests.extending.sqlite_logged import LoggedSQLiteWarehouse  # registers "sqlite-logged"


@pytest.fixture
def backend_url(tmp_path):
    return f"sqlite-logged:///{tmp_path / 'warehouse.sqlite3'}"


def test_the_scheme_selects_the_example_backend(backend_url, settings):
    assert backend_class(backend_url) is LoggedSQLiteWarehouse
    settings.WAREHOUSE_URL = backend_url
    reset_warehouse_cache()
    try:
        warehouse = get_warehouse()
        assert type(warehouse) is LoggedSQLiteWarehouse
        assert get_warehouse() is warehouse  # one per URL per process
        assert warehouse.target == backend_url.removeprefix("sqlite-logged:///")
    finally:
        reset_warehouse_cache()


def test_the_example_backend_logs_every_pointer_move(wh, caplog):
    stage(wh, "run-a", order_rows(3))
    stage(wh, "run-b", order_rows(3, seed=1))
    with caplog.at_level(logging.INFO, logger="backfill_portal.publications"):
        publish(wh, "run-a", None)
        publish(wh, "run-b", "run-a")
        wh.rollback(name=ORDERS.name, partition=DAY, to_run_id="run-a", expected_run_id="run-b", actor="oncall")
    assert [r.getMessage() for r in caplog.records] == [
        f"publish orders/{DAY}: None -> run-a by owner",
        f"publish orders/{DAY}: run-a -> run-b by owner",
        f"rollback orders/{DAY}: run-b -> run-a by oncall",
    ]


def test_an_unknown_scheme_is_one_line_at_start_and_at_first_use(settings):
    settings.WAREHOUSE_URL = "mysql://warehouse.example/wh"
    reason = check_warehouse_url(settings.WAREHOUSE_URL)
    assert reason.startswith("WAREHOUSE_URL: unsupported warehouse URL scheme 'mysql' (known: ")
    assert "sqlite" in reason and "postgresql" in reason and "\n" not in reason
    with pytest.raises(SystemCheckError, match=r"backends\.E001.*unsupported warehouse URL scheme 'mysql'"):
        call_command("check")
    reset_warehouse_cache()
    with pytest.raises(ValidationError, match="unsupported warehouse URL scheme 'mysql'"):
        get_warehouse()
