"""A process frozen while it holds the audit chain, which every audited write in the
portal waits for, holds those writes no longer than AUDIT_CHAIN_IDLE_SECONDS: the
server ends its transaction (rolled back, its event gone) and the chain goes on whole.
PostgreSQL only: SQLite's writers queue on the database file instead."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection, transaction

from backfill_portal.core.models import AuditEvent
from backfill_portal.core.services.audit import audit_record, audit_verify
from tests.workers import worker_env

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.django_db(transaction=True)

HOLDER = textwrap.dedent(
    """
    import time

    import django

    django.setup()
    from django.db import transaction

    from backfill_portal.core.services.audit import audit_record

    with transaction.atomic():
        audit_record(actor=None, action="test.frozen_holder", object_type="test", object_id="holder")
        print("holding", flush=True)
        time.sleep(600)
    """
)


@pytest.fixture
def frozen_holder():
    """A process that wrote an audit event in a transaction it has not ended, then
    stopped (SIGSTOP); its own bound is 2 seconds (AUDIT_CHAIN_IDLE_SECONDS=2)."""
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL only (DATABASE_URL): the chain's lock is PostgreSQL's advisory lock")
    env = worker_env(settings.WAREHOUSE_URL, AUDIT_CHAIN_IDLE_SECONDS=2, DJANGO_SETTINGS_MODULE="backfill_portal.settings")
    if not env["CELERY_BROKER_URL"]:
        del env["CELERY_BROKER_URL"]  # it sends no task: the default broker will do
    proc = subprocess.Popen([sys.executable, "-c", HOLDER], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.strip() == "holding", proc.stderr.read() if proc.poll() is not None else line
        os.kill(proc.pid, signal.SIGSTOP)
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_a_holder_frozen_with_the_audit_chain_holds_the_portals_writes_only_for_its_bound(frozen_holder):
    with connection.cursor() as cursor:
        cursor.execute("SET statement_timeout = '30s'")  # unbounded, this test would wait for ever
    try:
        started = time.monotonic()
        with transaction.atomic():
            audit_record(actor=None, action="test.after_the_frozen", object_type="test", object_id="writer")
        waited = time.monotonic() - started
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET statement_timeout")
    assert waited < 20, f"the write waited {waited:.1f}s for the frozen holder"
    assert AuditEvent.objects.filter(action="test.after_the_frozen").exists()
    assert not AuditEvent.objects.filter(action="test.frozen_holder").exists()  # the server rolled it back
    checked, broken = audit_verify()
    assert broken is None and checked == AuditEvent.objects.count()
