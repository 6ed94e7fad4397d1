"""A real Celery worker's output is the project's JSON lines, and every line its tasks
write for a run names the run, the attempt and the request. Celery replaces the root
logger's handlers unless told not to (backfill_portal/celery.py). Skipped (with the
reason) unless CI's second pass provides PostgreSQL and Redis."""
from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from backfill_portal.execution.choices import RunStatus
from backfill_portal.execution.models import Run
from tests.execution.test_pipeline import approved_request
from tests.workers import BROKER, stop

# Printed by Celery straight to the terminal when told to stop, past any logging.
SHUTDOWN_NOTICE = re.compile(r"^worker: \w+ shutdown \(MainProcess\)$")

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.worker,
    pytest.mark.skipif(not BROKER.startswith("redis"), reason="needs CELERY_BROKER_URL=redis://... (CI's second pass)"),
]


@pytest.fixture
def worker_log(start_worker, tmp_path):
    """Start a worker the plain way (its banner off: `celery -q`), return a function that
    stops it and returns its output's lines."""
    path = tmp_path / "worker.log"
    proc = start_worker(name="logs", quiet=True, args=("--loglevel", "INFO"), log=path, settle=0)

    def lines() -> list[str]:
        stop(proc)
        return path.read_text().splitlines()

    return lines


def test_a_real_workers_lines_are_json_and_name_the_run_attempt_and_request(personas, worker_log, run_log_dir):
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
    assert task_lines and all(line["run_id"] == run.run_id for line in task_lines)
    assert [line["attempt_no"] for line in task_lines if "execute_run" in line["msg"]] == [1]
    # The worker appended the run's lines to the session's run logs, not the checkout's.
    run_log = Path(run_log_dir) / f"{run.run_id}.jsonl"
    assert any(json.loads(text)["msg"] == started[0]["msg"] for text in run_log.read_text().splitlines())
