"""Readiness: can this process reach the metadata database, the warehouse and the
broker? Each check gets HEALTH_CHECK_TIMEOUT seconds and reports one line on failure."""
from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.db import connection

from backfill_portal.core.startup import probe_database


def check_database() -> None:
    # First a connection of its own with a connect timeout, so a server that is down is
    # named at once (the pool would wait DATABASE_POOL_TIMEOUT and say only "busy");
    # then this process's own connection, which the pages use.
    probe_database(timeout=settings.HEALTH_CHECK_TIMEOUT)
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception:
        # A broken connection must not be handed to the next request of this thread.
        connection.close()
        raise


def check_warehouse() -> None:
    from backfill_portal.backends import WarehouseUnavailable, probe_warehouse

    # A connection of its own, with a connect timeout: the backend's cached connection
    # would wait for the operating system's TCP timeout on a dead link. The probe
    # creates nothing: a SQLite warehouse whose file is gone is down.
    try:
        probe_warehouse(settings.WAREHOUSE_URL, timeout=settings.HEALTH_CHECK_TIMEOUT)
    except WarehouseUnavailable as exc:
        raise (exc.__cause__ or exc) from None  # the driver's own error names the cause


def check_broker() -> None:
    from backfill_portal.celery import app

    timeout = settings.HEALTH_CHECK_TIMEOUT
    # The URL from settings, as the app was configured from them (and tests can point it elsewhere).
    with app.connection_for_write(url=settings.CELERY_BROKER_URL, connect_timeout=timeout) as conn:
        conn.ensure_connection(max_retries=1, timeout=timeout)


CHECKS: dict[str, Callable[[], None]] = {
    "database": check_database,
    "warehouse": check_warehouse,
    "broker": check_broker,
}


def readiness() -> dict[str, dict]:
    """{name: {"ok": True} | {"ok": False, "error": "<one line>"}} for every check."""
    results = {}
    for name, check in CHECKS.items():
        try:
            check()
            results[name] = {"ok": True}
        except Exception as exc:
            message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            results[name] = {"ok": False, "error": f"{type(exc).__name__}: {message}"[:300]}
    return results
