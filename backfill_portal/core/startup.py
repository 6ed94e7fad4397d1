"""What a long-running process checks before it serves or takes work, so that a bad
setting stops it at start with one line naming it, as `manage.py` does, instead of
failing every request or task it takes afterwards (a worker with an unknown
WAREHOUSE_URL scheme took tasks and failed each; one whose metadata database did not
answer took them and left their runs queued).

- web (backfill_portal.wsgi, under gunicorn or any WSGI server) and the scheduler:
  the settings load, and Django's system checks report no error (the project's own:
  WAREHOUSE_URL names a registered backend, ...), as `runserver` requires;
- a worker, also: the metadata database answers. Not the warehouse: while it is down
  the workers are what notices it comes back (the probe task), so they must run.
"""
from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured


def configuration_problem(*, process: str) -> str | None:
    """None, or one line naming what stops `process` ("web", "worker", "beat")."""
    import django

    try:
        django.setup()
    except ImproperlyConfigured as exc:
        return str(exc)
    from django.conf import settings
    from django.core import checks

    errors = [m for m in checks.run_checks() if m.is_serious() and not m.is_silenced()]
    if errors:
        first = errors[0]
        hint = f" ({first.hint})" if first.hint else ""
        return f"{first.msg}{hint} [{first.id}]"
    if process == "worker":
        try:
            probe_database(timeout=settings.HEALTH_CHECK_TIMEOUT)
        except Exception as exc:
            return f"the metadata database (DATABASE_URL) does not answer: {one_line(exc)}"
    return None


def probe_database(*, timeout: float) -> None:
    """Open a connection of its own to the metadata database with a connect timeout and
    run SELECT 1; raises the driver's error. On PostgreSQL not through the pool, whose
    "no connection within DATABASE_POOL_TIMEOUT" hides the server's reason
    (connection refused, no such database, password failed) and waits its full timeout."""
    from django.db import connection

    if connection.vendor == "postgresql":
        import psycopg

        params = {**connection.get_connection_params(), "connect_timeout": max(1, round(timeout))}
        with psycopg.connect(**params) as probe:
            probe.execute("SELECT 1")
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")


def one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
