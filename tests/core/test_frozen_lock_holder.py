"""A process frozen while it holds one of the portal's shared locks holds the others no
longer than SHARED_LOCK_IDLE_SECONDS: the server ends its transaction (rolled back).
The audit chain, which every audited write waits for (the frozen event is gone and the
chain goes on whole), and the dispatch's lock, which every dispatch waits for.
PostgreSQL only: SQLite's writers queue on the database file instead."""
from __future__ import annotations

import contextlib
import textwrap
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection, transaction

from backfill_portal.core.models import AuditEvent
from backfill_portal.core.services.audit import audit_record, audit_verify
from backfill_portal.execution.services.dispatch import dispatch_serialise
from tests.conftest import frozen_once_holding
from tests.workers import worker_env

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.django_db(transaction=True)

HOLDER = textwrap.dedent(
    """
    import sys
    import time

    import django

    django.setup()
    from django.db import transaction

    from backfill_portal.core.services.audit import audit_record
    from backfill_portal.execution.services.dispatch import dispatch_serialise

    with transaction.atomic():
        if sys.argv[1] == "dispatch":
            dispatch_serialise()
        else:
            audit_record(actor=None, action="test.frozen_holder", object_type="test", object_id="holder")
        print("holding", flush=True)
        time.sleep(600)
    """
)


@contextlib.contextmanager
def frozen(what: str):
    """A process holding a shared lock in a transaction it has not ended, then stopped
    (SIGSTOP); its own bound is 2 seconds (SHARED_LOCK_IDLE_SECONDS=2). `what`: "audit"
    (it wrote an event, so holds the chain) or "dispatch" (it took the dispatch's lock)."""
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL only (DATABASE_URL): the shared locks are PostgreSQL's advisory locks")
    env = worker_env(settings.WAREHOUSE_URL, SHARED_LOCK_IDLE_SECONDS=2, DJANGO_SETTINGS_MODULE="backfill_portal.settings")
    if not env["CELERY_BROKER_URL"]:
        del env["CELERY_BROKER_URL"]  # it sends no task: the default broker will do
    with frozen_once_holding(["-c", HOLDER, what], cwd=ROOT, env=env) as proc:
        yield proc


def bounded(write) -> float:
    """Seconds `write` took in a transaction, under a 30 s statement timeout (without
    the bound it would wait for the frozen holder for ever)."""
    with connection.cursor() as cursor:
        cursor.execute("SET statement_timeout = '30s'")
    try:
        started = time.monotonic()
        with transaction.atomic():
            write()
        return time.monotonic() - started
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET statement_timeout")


def test_a_holder_frozen_with_the_audit_chain_holds_the_portals_writes_only_for_its_bound():
    with frozen("audit"):
        waited = bounded(lambda: audit_record(actor=None, action="test.after_the_frozen", object_type="test",
                                              object_id="writer"))
    assert waited < 20, f"the write waited {waited:.1f}s for the frozen holder"
    assert AuditEvent.objects.filter(action="test.after_the_frozen").exists()
    assert not AuditEvent.objects.filter(action="test.frozen_holder").exists()  # the server rolled it back
    checked, broken = audit_verify()
    assert broken is None and checked == AuditEvent.objects.count()


def test_a_holder_frozen_with_the_dispatch_lock_holds_the_dispatches_only_for_its_bound():
    with frozen("dispatch"):
        waited = bounded(dispatch_serialise)
    assert waited < 20, f"the dispatch waited {waited:.1f}s for the frozen holder"
