"""The scheduler anchors the audit log: `core.anchor_audit` is in the beat schedule,
safe to run twice, and a real beat + worker (PostgreSQL and Redis, CI's second pass)
appends the chain head to the anchor file by itself, again after the log grows."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from backfill_portal.core.models import AuditEvent
from backfill_portal.core.services.audit import audit_record

ROOT = Path(__file__).resolve().parents[2]
BROKER = os.environ.get("CELERY_BROKER_URL", "")


def anchored(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_anchor_audit_is_scheduled_and_safe_to_run_twice(db, audit_anchor_path):
    from backfill_portal.core.tasks import anchor_audit

    entry = next(e for e in settings.CELERY_BEAT_SCHEDULE.values() if e["task"] == "core.anchor_audit")
    assert 0 < entry["schedule"] <= 3600
    assert settings.CELERY_TASK_ROUTES["core.anchor_audit"] == {"queue": "production"}

    event = audit_record(actor=None, action="test.event", object_type="test", object_id=1)
    first = anchor_audit.apply(throw=True).get()
    second = anchor_audit.apply(throw=True).get()
    assert first == {"last_id": event.pk, "count": 1, "appended": True}
    assert second == {**first, "appended": False}
    assert [a["last_id"] for a in anchored(audit_anchor_path)] == [event.pk]


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(not BROKER.startswith("redis"), reason="needs CELERY_BROKER_URL=redis://... (CI's second pass)")
def test_a_real_scheduler_and_worker_anchor_the_log_as_it_grows(warehouse_url, tmp_path):
    if connection.vendor != "postgresql":
        pytest.skip("a worker process needs a database it can share: PostgreSQL (DATABASE_URL)")
    first = audit_record(actor=None, action="test.before", object_type="test", object_id=1)
    anchors = tmp_path / "scheduled-anchors.jsonl"
    db = settings.DATABASES["default"]
    env = {
        **os.environ,
        "DATABASE_URL": f"postgres://{db['USER'] or 'postgres'}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}",
        "WAREHOUSE_URL": warehouse_url,
        "CELERY_BROKER_URL": BROKER,
        "AUDIT_ANCHOR_PATH": str(anchors),
        "AUDIT_ANCHOR_SECONDS": "1",
    }
    subprocess.run([sys.executable, "-m", "celery", "-A", "backfill_portal", "purge", "-f", "-Q", "production,backfill"],
                   cwd=ROOT, env=env, capture_output=True, timeout=60)
    log = open(tmp_path / "worker.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "backfill_portal", "worker", "-B", "--schedule", str(tmp_path / "beat"),
         "-Q", "production,backfill", "--concurrency", "1", "--without-mingle", "--without-gossip",
         "-n", f"anchor{os.getpid()}@%h"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        def wait_for_anchor(last_id: int) -> dict:
            deadline = time.time() + 90
            while time.time() < deadline:
                found = [a for a in anchored(anchors) if a["last_id"] == last_id]
                if found:
                    return found[0]
                assert proc.poll() is None, (tmp_path / "worker.log").read_text()[-3000:]
                time.sleep(0.5)
            raise AssertionError(f"no anchor of #{last_id} after 90 s: {anchored(anchors)}")

        assert wait_for_anchor(first.pk)["count"] == AuditEvent.objects.count()
        later = audit_record(actor=None, action="test.after", object_type="test", object_id=2)
        assert wait_for_anchor(later.pk)["hash"] == later.hash
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
