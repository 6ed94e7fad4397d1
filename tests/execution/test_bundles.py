"""Bundles: the cheap intervals of one request run several to a task, step by step
together, each run with the whole trail a run alone has (services/bundles.py)."""
from __future__ import annotations

import re
from collections import Counter

import pytest

from backfill_portal.backfills.choices import IntervalStatus, RequestStatus
from backfill_portal.backfills.models import Interval
from backfill_portal.catalog.models import Job
from backfill_portal.core.models import AuditEvent
from backfill_portal.core.services.audit import audit_verify
from backfill_portal.execution.choices import AttemptStatus, RunStatus
from backfill_portal.execution.models import Attempt, CheckResult, Run
from backfill_portal.execution.services.dispatch import bundle_size
from backfill_portal.warehouse.models import Consumption, Publication, Version
from tests.execution import jobs as test_jobs
from tests.execution.test_pipeline import approved_request, expected_latest_items, published_rows
from tests.execution.test_task_logs import json_lines  # noqa: F401  (a fixture)

pytestmark = pytest.mark.django_db(transaction=True)

BUNDLE = "execution.execute_bundle"
ALONE = "execution.execute_run"


@pytest.fixture
def ready(catalog, demo_sources, task_queue, warehouse):
    return task_queue


def run_alone_first(personas, queue, job, start, end):
    """A first request of `job`, its runs sent one by one (at most 3 active intervals: one
    lane would be too few to share): afterwards the job is known to be cheap."""
    request = approved_request(personas, job=job, start=start, end=end, max_active_intervals=3)
    done = queue.drain()
    assert {task for task, _, _ in done} >= {ALONE} and BUNDLE not in {task for task, _, _ in done}
    return request


def trail(run: Run) -> Counter:
    """What a run leaves in the audit log: its own events and its attempts' and interval's."""
    attempt_ids = [str(pk) for pk in Attempt.objects.filter(run=run).values_list("pk", flat=True)]
    events = AuditEvent.objects.filter(object_type="run", object_id=str(run.pk)).values_list("action", flat=True)
    events = list(events) + list(AuditEvent.objects.filter(object_type="attempt", object_id__in=attempt_ids)
                                 .values_list("action", flat=True))
    events += list(AuditEvent.objects.filter(object_type="interval", object_id=str(run.interval_id))
                   .values_list("action", flat=True))
    return Counter(events)


def test_a_cheap_jobs_intervals_run_in_bundles_each_with_the_trail_of_a_run_alone(personas, ready, warehouse):
    first = run_alone_first(personas, ready, "page_views_hourly", "2022-10-01T00:00:00Z", "2022-10-01T11:00:00Z")
    alone = Run.objects.filter(request=first).order_by("pk").last()
    request = approved_request(personas, job="page_views_hourly", start="2022-10-02T00:00:00Z",
                               end="2022-10-02T23:00:00Z", max_active_intervals=8)
    done = ready.drain()
    bundles = [(args, result) for task, args, result in done if task == BUNDLE]
    assert bundles, [task for task, _, _ in done]
    assert all(len(args[0]) == 2 for args, _ in bundles)  # 4 at once (the job's limit): two lanes of 2
    bundled = {run_id for args, _ in bundles for run_id in args[0]}
    assert all(set(result.values()) == {"published"} for _, result in bundles)
    request.refresh_from_db()
    assert request.status == RequestStatus.RECONCILING
    assert set(Interval.objects.filter(request=request).values_list("status", flat=True)) == {IntervalStatus.PUBLISHED}
    runs = list(Run.objects.filter(request=request))
    assert len(runs) == 24 and len(bundled) >= 16  # most of the request went in bundles
    expected = trail(alone)
    for run in runs:
        assert run.status == RunStatus.PUBLISHED
        assert list(Attempt.objects.filter(run=run).values_list("status", flat=True)) == [AttemptStatus.SUCCEEDED]
        assert Version.objects.filter(run=run).count() == 1
        assert Publication.objects.filter(version__run=run).count() == 1
        assert Consumption.objects.filter(run=run).count() == Consumption.objects.filter(run=alone).count()
        assert CheckResult.objects.filter(run=run).count() == CheckResult.objects.filter(run=alone).count()
        assert trail(run) == expected, run.run_id  # the same events as a run alone, no more, no fewer
        rows = published_rows(warehouse, "page_views_hourly", run.partition_key)
        assert [r["_run_id"] for r in rows] == [run.run_id]
    checked, broken = audit_verify()
    assert broken is None and checked >= len(runs)  # the chain holds, every event signed in order


def test_a_failing_attempt_in_a_bundle_retries_alone_and_the_others_publish(personas, ready, warehouse):
    run_alone_first(personas, ready, "dwd_order_items_py", "2022-09-28", "2022-10-02")
    test_jobs.CRASH.update(after_fraction=0.92, times=1, let_through=1)  # the bundle's second run dies at 92 %
    try:
        request = approved_request(personas, job="dwd_order_items_py", start="2022-10-03", end="2022-10-08",
                                   max_active_intervals=8)
        done = ready.drain()
    finally:
        test_jobs.CRASH.update(after_fraction=None, times=0, let_through=0)
    bundles = [result for task, _, result in done if task == BUNDLE]
    assert bundles and "retrying" in bundles[0].values(), bundles
    request.refresh_from_db()
    assert request.status == RequestStatus.RECONCILING
    attempts = Counter(Attempt.objects.filter(run__request=request).values_list("run__run_id", "status"))
    failed = [run_id for (run_id, status) in attempts if status == AttemptStatus.FAILED]
    assert len(failed) == 1 and attempts[(failed[0], AttemptStatus.SUCCEEDED)] == 1
    for run in Run.objects.filter(request=request):
        assert run.status == RunStatus.PUBLISHED
        rows = published_rows(warehouse, "dwd_order_items_py", run.partition_key)
        keys = [(r["order_id"], r["item_id"]) for r in rows]
        assert len(keys) == len(set(keys)) == len(expected_latest_items(warehouse, run))  # not one row more


def test_a_bundle_takes_each_step_as_one_statement_per_edge_for_all_its_runs(personas, ready, settings):
    run_alone_first(personas, ready, "page_views_hourly", "2022-10-01T00:00:00Z", "2022-10-01T11:00:00Z")
    settings.EXECUTION_BUNDLE_LANES = 1  # one lane: the job's 4 at once in one bundle
    approved_request(personas, job="page_views_hourly", start="2022-10-02T00:00:00Z", end="2022-10-02T03:00:00Z",
                     max_active_intervals=8)
    ready.drain(skip=lambda task, args: task == BUNDLE)
    (run_ids,) = next(m for m in ready.sent if m[0] == BUNDLE)[1]
    assert len(run_ids) == 4
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from backfill_portal.celery import app

    with CaptureQueriesContext(connection) as statements:
        assert app.tasks[BUNDLE].apply(args=[run_ids], throw=True).get() == dict.fromkeys(run_ids, "published")
    sql = [q["sql"] for q in statements.captured_queries]

    def count(prefix):
        # A statement executed for many rows in one round trip is logged once, as "N times: ...".
        return sum(re.sub(r"^\d+ times: ", "", s).replace("INSERT OR IGNORE", "INSERT").startswith(prefix)
                   for s in sql)

    # queued -> running -> staged -> verifying -> verified -> published: one UPDATE each
    # for the 4 runs; one for the attempts, two for the intervals; one INSERT of each kind.
    assert count('UPDATE "execution_run" SET "status"') == 5
    assert count('UPDATE "execution_attempt" SET "status"') == 1
    assert count('UPDATE "backfills_interval" SET "status"') == 2
    for table in ("execution_attempt", "warehouse_version", "execution_checkresult", "warehouse_publication"):
        assert count(f'INSERT INTO "{table}"') == 1, table
    # Each step is a transaction of its own, with no savepoint around its common way; the
    # dispatch after the publications has the one savepoint (if it fails, they commit).
    assert count("SAVEPOINT") == 1
    # The runs claimed at one instant get one started_at, written as one value, not a CASE.
    (claim,) = [s for s in sql if s.startswith('UPDATE "execution_run" SET "status" = \'running\'')]
    assert '"started_at" = CASE' not in claim, claim


def test_in_a_bundle_a_run_that_fails_its_checks_fails_alone_and_the_others_publish(personas, ready, warehouse):
    first = run_alone_first(personas, ready, "dwd_order_items_py", "2022-09-28", "2022-10-02")
    alone = Run.objects.filter(request=first).order_by("pk").last()
    test_jobs.DUPLICATE.add("2022-10-04")
    try:
        request = approved_request(personas, job="dwd_order_items_py", start="2022-10-03", end="2022-10-08",
                                   max_active_intervals=8)
        done = ready.drain()
    finally:
        test_jobs.DUPLICATE.clear()
    results = {run_id: result for task, _, bundle in done if task == BUNDLE for run_id, result in bundle.items()}
    bad = Run.objects.get(request=request, partition_key="2022-10-04")
    assert results[bad.run_id] == "verification_failed"
    assert CheckResult.objects.get(run=bad, name="unique_business_key").passed is False
    assert warehouse.current("dwd_order_items_py", "2022-10-04") is None  # nothing of it visible
    good = Run.objects.filter(request=request).exclude(pk=bad.pk)
    assert len(good) == 5 and {results.get(run.run_id, "alone") for run in good} >= {"published"}
    expected = trail(alone)
    for run in good:
        assert run.status == RunStatus.PUBLISHED
        assert trail(run) == expected, run.run_id
        assert CheckResult.objects.filter(run=run).count() == CheckResult.objects.filter(run=alone).count()
    assert Interval.objects.get(request=request, partition_key="2022-10-04").status == IntervalStatus.FAILED
    assert audit_verify()[1] is None


def test_in_a_bundle_an_attempt_marked_lost_is_fenced_alone_and_its_retry_publishes_once(personas, ready, warehouse):
    first = run_alone_first(personas, ready, "dwd_order_items_py", "2022-09-28", "2022-10-02")
    alone = Run.objects.filter(request=first).order_by("pk").last()
    test_jobs.LOSE.add("2022-10-04")
    try:
        request = approved_request(personas, job="dwd_order_items_py", start="2022-10-03", end="2022-10-08",
                                   max_active_intervals=8)
        done = ready.drain()
    finally:
        test_jobs.LOSE.clear()
    results = {run_id: result for task, _, bundle in done if task == BUNDLE for run_id, result in bundle.items()}
    lost = Run.objects.get(request=request, partition_key="2022-10-04")
    assert results[lost.run_id] == "fenced"
    assert list(Attempt.objects.filter(run=lost).order_by("attempt_no").values_list("status", flat=True)) == [
        AttemptStatus.LOST, AttemptStatus.SUCCEEDED]
    request.refresh_from_db()
    assert request.status == RequestStatus.RECONCILING
    expected = trail(alone)
    for run in Run.objects.filter(request=request):
        assert run.status == RunStatus.PUBLISHED
        assert Publication.objects.filter(version__run=run).count() == 1
        rows = published_rows(warehouse, "dwd_order_items_py", run.partition_key)
        keys = [(r["order_id"], r["item_id"]) for r in rows]
        assert len(keys) == len(set(keys)) == len(expected_latest_items(warehouse, run))  # written once
        if run.pk != lost.pk:
            assert trail(run) == expected, run.run_id
    assert audit_verify()[1] is None


def test_a_bundle_delivered_twice_changes_nothing_the_second_time(personas, ready):
    run_alone_first(personas, ready, "page_views_hourly", "2022-10-01T00:00:00Z", "2022-10-01T11:00:00Z")
    request = approved_request(personas, job="page_views_hourly", start="2022-10-02T00:00:00Z",
                               end="2022-10-02T07:00:00Z", max_active_intervals=8)
    ready.drain(skip=lambda task, args: task == BUNDLE)  # the dispatch, not the bundles it sent
    bundles = [m for m in ready.sent if m[0] == BUNDLE]
    assert len(bundles) == 2 and len(ready.sent) == 2  # the job runs 4 at once: two lanes of 2
    from backfill_portal.celery import app

    (run_ids,) = bundles[0][1]
    first = app.tasks[BUNDLE].apply(args=[run_ids], throw=True).get()
    assert first == dict.fromkeys(run_ids, "published")
    events, publications = AuditEvent.objects.count(), Publication.objects.count()
    again = app.tasks[BUNDLE].apply(args=[run_ids], throw=True).get()
    assert again == dict.fromkeys(run_ids, "skipped-published")
    assert (AuditEvent.objects.count(), Publication.objects.count()) == (events, publications)
    ready.drain()
    request.refresh_from_db()
    assert request.status == RequestStatus.RECONCILING


def test_a_bundle_leaves_a_run_another_worker_claimed_to_it(personas, ready):
    run_alone_first(personas, ready, "page_views_hourly", "2022-10-01T00:00:00Z", "2022-10-01T11:00:00Z")
    approved_request(personas, job="page_views_hourly", start="2022-10-02T00:00:00Z", end="2022-10-02T03:00:00Z",
                     max_active_intervals=8)
    ready.drain(skip=lambda task, args: task == BUNDLE)
    (run_ids,) = next(m for m in ready.sent if m[0] == BUNDLE)[1]
    from backfill_portal.execution.services.runs import run_execute

    taken = run_ids[1]
    assert run_execute(run_id=taken) == "staged"  # another worker's attempt, verification left to its own task
    from backfill_portal.celery import app

    result = app.tasks[BUNDLE].apply(args=[run_ids], throw=True).get()
    assert result[taken] == "already-staged"
    assert [result[r] for r in run_ids if r != taken] == ["published"] * (len(run_ids) - 1)
    assert Attempt.objects.filter(run__run_id=taken).count() == 1


def test_only_cheap_jobs_with_a_history_and_no_side_effects_are_bundled(personas, ready, settings):
    request = approved_request(personas, job="page_views_hourly", start="2022-10-01T00:00:00Z",
                               end="2022-10-01T02:00:00Z", max_active_intervals=8)
    job = Job.objects.get(name="page_views_hourly")
    assert bundle_size(request, job, queued=8) == 1  # never run: not known to be cheap
    ready.drain()
    run_alone_first(personas, ready, "page_views_hourly", "2022-10-02T00:00:00Z", "2022-10-02T05:00:00Z")
    job.max_concurrent_runs = 8  # the pool lets 6 backfill runs go at once: 3 a lane
    assert bundle_size(request, job, queued=8) == 3
    assert bundle_size(request, job, queued=2) == 2
    job.max_concurrent_runs = 4  # its default: two lanes of 2
    assert bundle_size(request, job, queued=8) == 2
    request.max_active_intervals = 3
    assert bundle_size(request, job, queued=8) == 1  # one lane for two workers would idle one
    request.max_active_intervals = 8
    settings.EXECUTION_BUNDLE_LANES = 4  # four workers: runs alone keep all four busy
    assert bundle_size(request, job, queued=8) == 1
    settings.EXECUTION_BUNDLE_LANES = 1  # one worker: one lane of all 4
    assert bundle_size(request, job, queued=8) == 4
    settings.EXECUTION_BUNDLE_LANES = 2
    settings.EXECUTION_BUNDLE_SIZE = 1
    assert bundle_size(request, job, queued=8) == 1
    settings.EXECUTION_BUNDLE_SIZE = 4
    settings.EXECUTION_BUNDLE_MAX_SECONDS = 0.0
    assert bundle_size(request, job, queued=8) == 1  # its runs took longer than that
    settings.EXECUTION_BUNDLE_MAX_SECONDS = 2.0
    request.verify_twice = True
    assert bundle_size(request, job, queued=8) == 1
    request.verify_twice = False
    job.has_side_effects = True
    assert bundle_size(request, job, queued=8) == 1
    job.has_side_effects, job.depends_on_past = False, True
    assert bundle_size(request, job, queued=8) == 1
    job.depends_on_past = False
    # Every gate raised for the cheap job: 40 at once is 20 a lane, which an
    # EXECUTION_BUNDLE_SIZE of 16 (the default) caps.
    settings.EXECUTION_BUNDLE_SIZE = 16
    request.max_active_intervals = job.max_concurrent_runs = job.dataset.team.max_concurrent_runs = 40
    job.pool.slots = 40 + job.pool.reserved_for_production
    assert bundle_size(request, job, queued=40) == 16
    assert bundle_size(request, job, queued=10) == 10


def test_a_bundles_lines_each_name_the_run_they_are_about_and_its_last_line_none(personas, ready, json_lines):
    run_alone_first(personas, ready, "page_views_hourly", "2022-10-01T00:00:00Z", "2022-10-01T11:00:00Z")
    request = approved_request(personas, job="page_views_hourly", start="2022-10-02T00:00:00Z",
                               end="2022-10-02T03:00:00Z", max_active_intervals=8)
    ready.drain()
    runs = {run.run_id: run for run in Run.objects.filter(request=request)}
    lines = json_lines()
    for run_id, run in runs.items():
        started = [line for line in lines if line["msg"].startswith("attempt 1 of page_views_hourly")
                   and line["msg"].endswith("(bundle)") and line["run_id"] == run_id]
        assert len(started) == 1 and started[0]["attempt_no"] == 1 and started[0]["request_id"] == request.pk
        published = [line for line in lines if line["msg"].startswith(f"published page_views_hourly/{run.partition_key}")]
        assert [line["run_id"] for line in published] == [run_id]
        assert all(line["attempt_no"] in (None, 1) for line in published)
    # Celery's line for a bundle names its request and none of its runs.
    done = [line for line in lines if line["logger"] == "celery.app.trace" and "execute_bundle" in line["msg"]
            and "succeeded" in line["msg"]]
    assert done and all(line["run_id"] is None and line["request_id"] == request.pk for line in done)
