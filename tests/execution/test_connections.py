"""Worker processes keep their database connection from one task to the next (Celery's
Django fixup would close it around every task: a new PostgreSQL backend each time) and
still drop one that Django would drop: too old, or failing its health check."""
from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from celery.fixups.django import DjangoWorkerFixup
from django.conf import settings
from django.db import connection

from backfill_portal.celery import app, close_old_connections

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql",
                       reason="SQLite's in-memory test database is never really closed (CI's second pass runs these)"),
]

IN_WORKER = SimpleNamespace(request=SimpleNamespace(is_eager=False))


def around_tasks(fixup: DjangoWorkerFixup, n: int) -> None:
    """What the worker's task_prerun and task_postrun signals do around n tasks."""
    for _ in range(n):
        fixup.on_task_prerun(IN_WORKER)
        close_old_connections(sender=IN_WORKER)
        fixup.on_task_postrun(IN_WORKER)
        close_old_connections(sender=IN_WORKER)


def test_a_worker_process_keeps_its_connection_from_task_to_task():
    fixup = DjangoWorkerFixup(app)
    assert fixup.db_reuse_max == settings.CELERY_DB_REUSE_MAX >= 100
    connection.ensure_connection()
    raw = connection.connection

    around_tasks(fixup, 50)

    assert connection.connection is raw and not raw.closed


def test_a_connection_older_than_conn_max_age_is_replaced_before_the_next_task():
    connection.ensure_connection()
    connection.close_at = time.monotonic() - 1

    around_tasks(DjangoWorkerFixup(app), 1)

    assert connection.connection is None  # the next query opens a new one
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        assert cursor.fetchone() == (1,)


def test_a_broken_connection_is_replaced_before_the_next_task():
    connection.ensure_connection()
    connection.connection.close()  # the server went away
    connection.errors_occurred = True

    close_old_connections(sender=IN_WORKER)

    assert connection.connection is None


def test_a_task_run_in_the_callers_process_leaves_the_callers_connection_alone():
    connection.ensure_connection()
    raw = connection.connection
    connection.close_at = time.monotonic() - 1

    close_old_connections(sender=SimpleNamespace(request=SimpleNamespace(is_eager=True)))

    assert connection.connection is raw
