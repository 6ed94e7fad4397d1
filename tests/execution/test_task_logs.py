"""Every line a task writes is the project's JSON line naming its run, attempt and
request. In-process (Celery's own `apply`, as the task queue fixture runs tasks); the
real worker's output is tested in test_worker_logs.py."""
from __future__ import annotations

import io
import json
import logging

import pytest

from backfill_portal.core.logging import StructuredFormatter, log_context, task_log_scope_close, task_log_scope_open
from backfill_portal.execution.models import Run
from tests.execution.test_pipeline import approved_request

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def json_lines():
    """The lines the root logger writes while the test runs, formatted as the worker's
    handler formats them (at emit time, inside the task's context)."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(StructuredFormatter())
    root = logging.getLogger()
    root.addHandler(handler)
    level = root.level
    root.setLevel(logging.INFO)
    yield lambda: [json.loads(line) for line in out.getvalue().splitlines()]
    root.removeHandler(handler)
    root.setLevel(level)


def test_every_line_a_task_writes_names_its_run_attempt_and_request(personas, catalog, demo_sources, task_queue,
                                                                    json_lines):
    request = approved_request(personas, start="2022-10-01", end="2022-10-01")
    task_queue.drain()
    run = Run.objects.get(request=request)
    lines = json_lines()
    assert lines and all({"run_id", "attempt_no", "request_id"} <= set(line) for line in lines)
    mine = [line for line in lines if line["run_id"] == run.run_id]
    assert all(line["request_id"] == request.pk for line in mine)
    started = [line for line in mine if line["msg"] == "attempt 1 of dwd_order_items 2022-10-01 started"]
    assert len(started) == 1 and started[0]["attempt_no"] == 1
    assert any(line["msg"].startswith("published dwd_order_items/2022-10-01") for line in mine)
    # Celery's own line after the task returned still names the attempt that ran.
    succeeded = [line for line in mine if line["logger"] == "celery.app.trace" and "succeeded" in line["msg"]]
    assert {line["msg"].split("[")[0] for line in succeeded} >= {"Task execution.execute_run"}
    # The execute task verified and published the run it staged, in the same task.
    assert [line["msg"].rsplit(": ", 1)[-1] for line in succeeded if "execute_run" in line["msg"]] == ["'published'"]
    assert [line["attempt_no"] for line in succeeded if "execute_run" in line["msg"]] == [1]
    # A request-level task (dispatch) names its request and no run.
    assert any(line["request_id"] == request.pk and line["run_id"] is None for line in lines
               if line["logger"] == "celery.app.trace" and "dispatch_request" in line["msg"])


def test_a_line_outside_any_task_has_the_keys_with_nothing_in_them():
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "hello %s", ("there",), None)
    line = json.loads(StructuredFormatter().format(record))
    assert line["msg"] == "hello there"
    assert (line["run_id"], line["attempt_no"], line["request_id"]) == (None, None, None)


def test_a_task_scope_keeps_what_its_attempt_set_and_forgets_it_when_closed():
    formatter = StructuredFormatter()
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "m", (), None)
    token = task_log_scope_open(run_id="run_1", request_id=7)
    try:
        with log_context(attempt_no=2):
            assert json.loads(formatter.format(record))["attempt_no"] == 2
        after = json.loads(formatter.format(record))
        assert (after["run_id"], after["attempt_no"], after["request_id"]) == ("run_1", 2, 7)
    finally:
        task_log_scope_close(token)
    assert json.loads(formatter.format(record))["run_id"] is None
