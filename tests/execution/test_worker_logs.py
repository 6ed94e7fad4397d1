"""A real Celery worker's output is the project's JSON lines, and every line its tasks
write for a run names the run, the attempt and the request. Celery replaces the root
logger's handlers unless told not to (backfill_portal/celery.py). Skipped (with the
reason) unless CI's second pass provides PostgreSQL and Redis."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from backfill_portal.execution.choices import RunStatus
from backfill_portal.execution.models import Run
from tests.execution.test_pipeline import approved_request

ROOT = Path(__file__).resolve().parents[2]
BROKER = os.environ.get("CELERY_BROKER_URL", "")
# Printed by Celery straight to the terminal when told to stop, past any logging.
SHUTDOWN_NOTICE = re.compile(r"^worker: \w+ shutdown \(MainProcess\)$")

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.worker,
    pytest.mark.skipif(not BROKER.startswith("redis"), reason="needs CELERY_BROKER_URL=redis://... (CI's second pass)"),
]


@pytest.fixture
def worker_log(warehouse_url, catalog, tmp_path):
    """Start a worker the plain way (its banner off: `celery -q`), yield a function that
    stops it and returns its output's lines."""
    if connection.vendor != "postgresql":
        pytest.skip("a worker process needs a database it can share: PostgreSQL (DATABASE_URL)")
    db = settings.DATABASES["default"]
    env = {
        **os.environ,
        "DATABASE_URL": f"postgres://{db['USER'] or 'postgres'}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}",
        "WAREHOUSE_URL": warehouse_url,
        "CELERY_BROKER_URL": BROKER,
        "LOG_LEVEL": "INFO",
    }
    subprocess.run([sys.executable, "-m", "celery", "-A", "backfill_portal", "purge", "-f", "-Q", "production,backfill"],
                   cwd=ROOT, env=env, capture_output=True, timeout=60)
    path = tmp_path / "worker.log"
    log = open(path, "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "backfill_portal", "-q", "worker", "-Q", "production,backfill",
         "--concurrency", "2", "--loglevel", "INFO", "--without-mingle", "--without-gossip",
         "-n", f"logs{os.getpid()}@%h"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def stop() -> list[str]:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        log.close()
        return path.read_text().splitlines()

    yield stop
    stop()


def test_a_real_workers_lines_are_json_and_name_the_run_attempt_and_request(personas, worker_log):
    request = approved_request(personas, job="slow_items", start="2022-10-01", end="2022-10-01")
    deadline = time.time() + 90
    run = None
    while time.time() < deadline:
        run = Run.objects.filter(request=request).first()
        if run is not None and run.status in (RunStatus.PUBLISHED, RunStatus.FAILED, RunStatus.VERIFICATION_FAILED):
            break
        time.sleep(0.5)
    assert run is not None and run.status == RunStatus.PUBLISHED, run and run.error
    time.sleep(1)  # the verify task's own "succeeded" line comes after the publication
    raw = worker_log()

    lines = []
    for text in raw:
        if not text.strip() or SHUTDOWN_NOTICE.match(text):
            continue
        try:
            lines.append(json.loads(text))
        except ValueError:
            pytest.fail(f"a worker line is not JSON: {text!r}")
    assert lines and all({"ts", "level", "logger", "msg", "run_id", "attempt_no", "request_id"} <= set(line)
                         for line in lines)
    assert not any("ForkPoolWorker" in text for text in raw)

    mine = [line for line in lines if line["run_id"] == run.run_id]
    assert mine and all(line["request_id"] == request.pk for line in mine)
    started = [line for line in mine if line["msg"] == "attempt 1 of slow_items 2022-10-01 started"]
    assert len(started) == 1 and started[0]["attempt_no"] == 1
    assert any(line["msg"].startswith("published slow_items/2022-10-01") for line in mine)
    # Every line a run's task writes, Celery's own included, names the run.
    task_lines = [line for line in lines if line["logger"] == "celery.app.trace"
                  and ("execute_run" in line["msg"] or "verify_run" in line["msg"])]
    assert len(task_lines) >= 2 and all(line["run_id"] == run.run_id for line in task_lines)
    assert [line["attempt_no"] for line in task_lines if "execute_run" in line["msg"]] == [1]
