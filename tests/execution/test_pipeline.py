"""The data plane end to end: approved request -> runs -> staged versions -> checks ->
atomic publication; and the faults of DESIGN.md's invariants 1-6."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from backfill_portal.backfills.choices import IntervalStatus, RequestStatus
from backfill_portal.backfills.models import Interval
from backfill_portal.backfills.services.requests import (
    backfill_request_cancel,
    backfill_request_create,
    backfill_request_decide,
    backfill_request_submit,
)
from backfill_portal.catalog.models import Job
from backfill_portal.core.models import AuditEvent
from backfill_portal.execution.choices import AttemptStatus, RunStatus
from backfill_portal.execution.models import Attempt, CheckResult, Delivery, Run
from backfill_portal.execution.services import runs as runs_service
from backfill_portal.execution.services.dispatch import dispatch_all, request_retry_failed
from backfill_portal.warehouse.models import Consumption, Publication, Version
from backfill_portal.catalog.specs import spec_for
from tests.conftest import ALSO_ON_ICEBERG
from tests.execution import jobs as test_jobs

pytestmark = pytest.mark.django_db(transaction=True)


def approved_request(personas, job="dwd_order_items", start="2022-10-01", end="2022-10-03", requester="alice",
                     approver="olivia", **kwargs):
    request, _ = backfill_request_create(actor=personas[requester], job=job, start=start, end=end,
                                         reason="bug 4711 fixed", **kwargs)
    backfill_request_submit(actor=personas[requester], request_id=request.pk, confirm_overlap=True)
    backfill_request_decide(actor=personas[approver], request_id=request.pk, approve=True)
    for step in request.approval_steps.filter(status="pending").select_related("approver"):
        backfill_request_decide(actor=step.approver or personas["admin"], request_id=request.pk, approve=True)
    request.refresh_from_db()
    return request


def expected_latest_items(warehouse, run):
    """What dwd_order_items must hold for an interval, computed independently."""
    events = warehouse.source_sql(name="ods_order_events", time_column="event_time",
                                  start=run.data_interval_start, end=run.data_interval_end)
    rows = warehouse.query_dicts(f"SELECT * FROM {events} AS e")
    latest = {}
    for r in rows:
        if r["item_id"] is None:
            continue
        key = (r["order_id"], r["item_id"])
        rank = (str(r["updated_at"]), r["event_id"])
        if key not in latest or rank > latest[key][0]:
            latest[key] = (rank, r)
    return {k: round(float(v[1]["amount"]), 2) for k, v in latest.items()}


def published_rows(warehouse, dataset, partition):
    return warehouse.read_partition(dataset, partition)


@pytest.fixture
def ready(catalog, demo_sources, task_queue, warehouse):
    return task_queue


@ALSO_ON_ICEBERG
def test_approved_request_publishes_every_interval_with_exactly_the_expected_rows(personas, ready, warehouse):
    request = approved_request(personas)
    assert request.status == RequestStatus.RUNNING
    ready.drain()
    request.refresh_from_db()
    assert request.status == RequestStatus.RECONCILING
    assert set(Interval.objects.filter(request=request).values_list("status", flat=True)) == {IntervalStatus.PUBLISHED}
    for run in Run.objects.filter(request=request):
        assert run.status == RunStatus.PUBLISHED
        rows = published_rows(warehouse, "dwd_order_items", run.partition_key)
        expected = expected_latest_items(warehouse, run)
        assert len(rows) == len(expected) > 0
        assert {(r["order_id"], r["item_id"]) for r in rows} == set(expected)
        assert {r["_run_id"] for r in rows} == {run.run_id}
        assert warehouse.current("dwd_order_items", run.partition_key) == run.run_id
        assert Publication.objects.filter(version__run=run).count() == 1
        watermark = Consumption.objects.get(run=run, dataset__name="ods_order_events").watermark
        assert watermark["row_count"] > 0 and watermark["max_ingested_at"]
        checks = {c.name: c.passed for c in CheckResult.objects.filter(run=run)}
        assert checks["unique_business_key"] and checks["no_null_business_key"] and checks["row_count_positive"]
    # Every run transition is in the audit log, with the run id.
    actions = set(AuditEvent.objects.filter(request_id=request.pk).values_list("action", flat=True))
    assert {"run.created", "run.running", "run.staged", "run.verifying", "run.verified", "run.published"} <= actions


@ALSO_ON_ICEBERG
def test_rerun_ten_times_never_changes_the_published_fingerprint(personas, ready, warehouse):
    fingerprints, counts = set(), set()
    for i in range(10):
        request = approved_request(personas, start="2022-10-02", end="2022-10-02")
        ready.drain()
        run = Run.objects.get(request=request)
        assert run.status == RunStatus.PUBLISHED, run.error
        version = Version.objects.get(run=run)
        fingerprints.add(version.fingerprint)
        counts.add(version.row_count)
        assert len(published_rows(warehouse, "dwd_order_items", "2022-10-02")) == version.row_count
    assert len(fingerprints) == 1 and len(counts) == 1
    # History is serial: each publication replaced the one before.
    pubs = list(Publication.objects.filter(dataset__name="dwd_order_items", partition_key="2022-10-02").order_by("id"))
    assert len(pubs) == 10
    assert all(p.previous_version_id == q.version_id for q, p in zip(pubs, pubs[1:]))
    assert Run.objects.filter(status=RunStatus.SUPERSEDED).count() == 9


@ALSO_ON_ICEBERG
def test_attempt_that_dies_after_writing_92_percent_is_retried_into_an_exact_partition(personas, ready, warehouse):
    test_jobs.CRASH.update(after_fraction=0.92, times=1)
    request = approved_request(personas, job="dwd_order_items_py", start="2022-10-01", end="2022-10-01")
    ready.drain()
    run = Run.objects.get(request=request)
    attempts = list(Attempt.objects.filter(run=run).order_by("attempt_no"))
    assert [a.status for a in attempts] == [AttemptStatus.FAILED, AttemptStatus.SUCCEEDED]
    assert "worker died after writing" in attempts[0].error
    run.refresh_from_db()
    assert run.status == RunStatus.PUBLISHED
    rows = published_rows(warehouse, "dwd_order_items_py", "2022-10-01")
    expected = expected_latest_items(warehouse, run)
    assert len(rows) == len(expected)
    keys = [(r["order_id"], r["item_id"]) for r in rows]
    assert len(keys) == len(set(keys))  # zero duplicate keys
    profile = warehouse.profile(spec=spec_for(run.job.dataset), run_id=run.run_id)
    assert profile.duplicate_keys == 0 and profile.row_count == len(expected)


@ALSO_ON_ICEBERG
def test_committed_but_not_acknowledged_publishes_once_without_writing_again(personas, ready, warehouse, monkeypatch):
    """The rows and marker commit, the worker dies before recording success; the sweeper
    marks the attempt lost; the next attempt sees the marker and does not write again."""
    request = approved_request(personas, start="2022-10-01", end="2022-10-01")
    attempts = connection.ops.quote_name(Attempt._meta.db_table)

    def killed_recording_success(execute, sql, params, many, context):
        """The process dies as it writes the attempt's success to the metadata database,
        after the warehouse committed the rows and the marker."""
        if (sql.lstrip().upper().startswith("UPDATE") and attempts in sql
                and AttemptStatus.SUCCEEDED in (params or ())):
            raise SystemExit("worker killed after commit")  # not caught by the attempt's error handling
        return execute(sql, params, many, context)

    with pytest.raises(SystemExit), connection.execute_wrapper(killed_recording_success):
        ready.drain()
    run = Run.objects.get(request=request)
    marker = warehouse.marker(run.run_id)
    assert marker is not None and marker.attempt_no == 1
    assert run.status == RunStatus.RUNNING
    staged = []
    real_execute = __import__("backfill_portal.execution.executors", fromlist=["execute"]).execute
    monkeypatch.setattr("backfill_portal.execution.executors.execute",
                        lambda *a, **k: staged.append(1) or real_execute(*a, **k))
    assert runs_service.attempts_sweep_lost(now=timezone.now() + timedelta(hours=1)) == 1
    ready.drain()
    run.refresh_from_db()
    assert run.status == RunStatus.PUBLISHED
    assert staged == []  # the second attempt did not write
    assert [a.status for a in run.attempts.order_by("attempt_no")] == [AttemptStatus.LOST, AttemptStatus.SUCCEEDED]
    assert Publication.objects.filter(version__run=run).count() == 1
    assert warehouse.marker(run.run_id).attempt_no == 1


def test_stale_attempt_is_fenced_its_heartbeat_and_result_refused(personas, ready, warehouse, monkeypatch):
    request = approved_request(personas, start="2022-10-01", end="2022-10-01")
    # Run the dispatch only, then the run's task by hand, on a worker that goes stale
    # (frozen past its heartbeat timeout) before it stages: the sweeper marks its
    # attempt lost meanwhile, and it stages its rows all the same when it wakes up.
    ready.drain(skip=lambda task, args: task == "execution.execute_run")
    run = Run.objects.get(request=request)
    from backfill_portal.execution import executors

    stage = executors.execute
    seen = {}

    def stale_then_staged(run, attempt_no, warehouse, **kwargs):
        attempt = Attempt.objects.get(run=run, attempt_no=attempt_no)
        seen["beat while running"] = runs_service.attempt_heartbeat(attempt_pk=attempt.pk)
        runs_service.attempts_sweep_lost(now=timezone.now() + timedelta(hours=1))
        attempt.refresh_from_db()
        seen["status after the sweep"] = attempt.status
        seen["beat after the sweep"] = runs_service.attempt_heartbeat(attempt_pk=attempt.pk)
        return stage(run, attempt_no, warehouse)  # frozen: it never saw the fence

    with monkeypatch.context() as patch:
        patch.setattr(executors, "execute", stale_then_staged)
        # The stale worker's success is refused.
        assert runs_service.run_execute(run_id=run.run_id, worker="stale-worker") == "fenced"
    assert seen == {"beat while running": True, "status after the sweep": AttemptStatus.LOST,
                    "beat after the sweep": False}
    assert run.attempts.get(attempt_no=1).status == AttemptStatus.LOST
    # The new attempt finds the marker and publishes exactly once.
    ready.drain()
    run.refresh_from_db()
    assert run.status == RunStatus.PUBLISHED
    assert Publication.objects.filter(version__run=run).count() == 1


@ALSO_ON_ICEBERG
def test_failed_blocking_check_leaves_the_previous_version_visible(personas, ready, warehouse, catalog):
    first = approved_request(personas, start="2022-10-01", end="2022-10-01")
    ready.drain()
    good = Run.objects.get(request=first)
    before = published_rows(warehouse, "dwd_order_items", "2022-10-01")
    # A code change that keeps every event version (append-style) duplicates keys.
    from backfill_portal.catalog.services.sync import catalog_sync
    from tests.conftest import TEST_CATALOG

    good_start = TEST_CATALOG.index("SELECT order_id, item_id, category, amount FROM (")
    good_end = TEST_CATALOG.index(") AS latest WHERE rn = 1\n") + len(") AS latest WHERE rn = 1\n")
    appending = ("SELECT order_id, item_id, category, amount FROM {{ ref('ods_order_events') }} AS e "
                 "WHERE item_id IS NOT NULL\n")
    catalog_sync(text=TEST_CATALOG[:good_start] + appending + TEST_CATALOG[good_end:])
    second = approved_request(personas, start="2022-10-01", end="2022-10-01")
    ready.drain()
    bad = Run.objects.get(request=second)
    assert bad.status == RunStatus.VERIFICATION_FAILED
    assert CheckResult.objects.get(run=bad, name="unique_business_key").passed is False
    assert warehouse.current("dwd_order_items", "2022-10-01") == good.run_id
    assert published_rows(warehouse, "dwd_order_items", "2022-10-01") == before
    second.refresh_from_db()
    assert second.status == RequestStatus.FAILED


@ALSO_ON_ICEBERG
def test_a_publish_interrupted_after_the_pointer_switch_is_finished_not_repeated(personas, ready, warehouse,
                                                                                 monkeypatch):
    from backfill_portal.execution.services import verify as verify_service

    request = approved_request(personas, start="2022-10-01", end="2022-10-01")
    real = verify_service.interval_transition

    def dies_before_the_mirror(interval, *, to, **kwargs):
        if to == IntervalStatus.PUBLISHED:
            raise RuntimeError("the worker died after switching the pointer")
        return real(interval, to=to, **kwargs)

    monkeypatch.setattr(verify_service, "interval_transition", dies_before_the_mirror)
    with pytest.raises(RuntimeError):
        ready.drain()
    run = Run.objects.get(request=request)
    assert run.status == RunStatus.VERIFIED  # the metadata mirror rolled back...
    assert not Publication.objects.filter(version__run=run).exists()
    assert warehouse.current("dwd_order_items", "2022-10-01") == run.run_id  # ...the switch did not
    monkeypatch.setattr(verify_service, "interval_transition", real)
    assert verify_service.run_publish(run_id=run.run_id) == "published"
    run.refresh_from_db()
    assert run.status == RunStatus.PUBLISHED
    assert Publication.objects.filter(version__run=run).count() == 1
    history = [record.run_id for record in warehouse.history("dwd_order_items", "2022-10-01")]
    assert history.count(run.run_id) == 1  # switched once, not again


@ALSO_ON_ICEBERG
def test_side_effect_authorised_in_two_overlapping_requests_delivers_once(personas, ready, warehouse):
    dwd = approved_request(personas, start="2022-10-01", end="2022-10-01")
    ready.drain()
    dws = approved_request(personas, job="dws_sales_daily", start="2022-10-01", end="2022-10-01", approver="sam")
    ready.drain()
    assert Run.objects.get(request=dws).status == RunStatus.PUBLISHED
    for _ in range(2):
        req = approved_request(personas, job="notify_finance", start="2022-10-01", end="2022-10-01",
                               approver="finn", side_effects=["notify_finance"])
        ready.drain()
    assert Delivery.objects.filter(job__name="notify_finance", partition_key="2022-10-01").count() == 1
    assert dwd.pk != req.pk


def test_side_effect_node_as_the_target_is_refused_unless_authorised(personas, ready, warehouse):
    """Filing it unauthorised is refused (it was filed, approved and then skipped whole);
    a side-effect node a cascade reaches unauthorised is still skipped at run time
    (tests/governance/test_cascade.py)."""
    from backfill_portal.core.errors import ValidationError

    with pytest.raises(ValidationError, match="notify_finance is a side-effect node"):
        approved_request(personas, job="notify_finance", start="2022-10-01", end="2022-10-02", approver="finn")
    assert not Interval.objects.exists() and not Run.objects.exists()
    assert Delivery.objects.count() == 0


def test_dispatch_respects_max_active_intervals_and_job_limit(personas, ready, warehouse):
    request = approved_request(personas, start="2022-10-01", end="2022-10-06", max_active_intervals=2)
    ready.drain(limit=1)  # the dispatch alone
    assert Interval.objects.filter(request=request, status=IntervalStatus.QUEUED).count() == 2
    Job.objects.filter(name="dwd_order_items").update(max_concurrent_runs=1)
    other = approved_request(personas, start="2022-10-07", end="2022-10-08", max_active_intervals=4)
    ready.drain(limit=1, skip=lambda task, args: task != "execution.dispatch_request")
    assert Run.objects.filter(request=other).count() == 0  # the job gate is full
    Job.objects.filter(name="dwd_order_items").update(max_concurrent_runs=4)
    ready.drain()
    dispatch_all()  # the sweeper's periodic dispatch picks up what the gate held back
    ready.drain()
    for req in (request, other):
        req.refresh_from_db()
        assert req.status == RequestStatus.RECONCILING


def test_custom_assertions_are_counted_each_and_a_broken_one_is_reported_alone(personas, ready, warehouse):
    from backfill_portal.catalog.models import Dataset

    Dataset.objects.filter(name="dwd_order_items").update(checks=[
        {"name": "no_negative_amount", "blocking": True, "sql": "SELECT * FROM {{ this }} AS t WHERE t.amount < 0"},
        {"name": "broken", "blocking": False, "sql": "SELECT t.no_such_column FROM {{ this }} AS t"},
        {"name": "big_amounts", "blocking": False, "sql": "SELECT * FROM {{ this }} AS t WHERE t.amount > 100"},
    ])
    request = approved_request(personas, start="2022-10-01", end="2022-10-01")
    ready.drain()
    run = Run.objects.get(request=request)
    assert run.status == RunStatus.PUBLISHED  # the failures are warnings
    results = {c.name: c for c in CheckResult.objects.filter(run=run)}
    big = sum(1 for row in published_rows(warehouse, "dwd_order_items", "2022-10-01") if float(row["amount"]) > 100)
    assert big > 0
    assert results["no_negative_amount"].passed and results["no_negative_amount"].observed == {"failing_rows": 0}
    assert not results["big_amounts"].passed and results["big_amounts"].observed == {"failing_rows": big}
    assert results["big_amounts"].message == f"{big} row(s) violate the assertion"
    assert not results["broken"].passed and results["broken"].message.startswith("could not run")
    assert "no_such_column" in results["broken"].message


def test_a_publication_fills_the_slot_it_frees_in_the_same_task(personas, ready, warehouse):
    request = approved_request(personas, start="2022-10-01", end="2022-10-04", max_active_intervals=1)
    ready.drain()
    request.refresh_from_db()
    assert request.status == RequestStatus.RECONCILING
    # One dispatch task (after approval) for four intervals: each publication queued the
    # next interval itself, without a dispatch task of its own.
    assert [task for task, _, _ in ready.ran].count("execution.dispatch_request") == 1
    assert [task for task, _, _ in ready.ran].count("execution.execute_run") == 4


def test_a_dispatch_that_fails_after_publication_leaves_it_to_the_sweeper(personas, ready, warehouse, monkeypatch):
    from backfill_portal.execution.services import verify as verify_service

    request = approved_request(personas, start="2022-10-01", end="2022-10-02", max_active_intervals=1)

    def broken(*, request_id):
        raise RuntimeError("database went away")

    with monkeypatch.context() as patched:
        patched.setattr(verify_service, "dispatch_request", broken)
        ready.drain()
    first = Run.objects.get(request=request, partition_key="2022-10-01")
    assert first.status == RunStatus.PUBLISHED  # the publication stands
    assert not Run.objects.filter(request=request, partition_key="2022-10-02").exists()
    dispatch_all()  # the sweeper's periodic dispatch
    ready.drain()
    request.refresh_from_db()
    assert request.status == RequestStatus.RECONCILING


def test_backward_strategy_runs_newest_first(personas, ready, warehouse):
    request = approved_request(personas, start="2022-10-01", end="2022-10-04", strategy="backward",
                               max_active_intervals=1)
    ready.drain()
    order = list(Run.objects.filter(request=request).order_by("id").values_list("partition_key", flat=True))
    assert order == ["2022-10-04", "2022-10-03", "2022-10-02", "2022-10-01"]


def crashing_request(personas, ready, *, max_attempts: int):
    """A request of the Python job whose callable raises on every attempt, run to its end."""
    Job.objects.filter(name="dwd_order_items_py").update(max_attempts=max_attempts)
    test_jobs.CRASH.update(after_fraction=0.0, times=100)
    try:
        request = approved_request(personas, job="dwd_order_items_py", start="2022-10-01", end="2022-10-02")
        ready.drain()
    finally:
        test_jobs.CRASH.update(after_fraction=None, times=0)
    request.refresh_from_db()
    return request


def test_callable_that_raises_stops_at_max_attempts_and_the_queue_drains(personas, ready, warehouse):
    request = crashing_request(personas, ready, max_attempts=2)
    assert not ready.sent
    assert request.status == RequestStatus.FAILED
    for run in Run.objects.filter(request=request):
        assert run.status == RunStatus.FAILED and "worker died" in run.error
        assert run.attempts.count() == 2
        assert warehouse.current("dwd_order_items_py", run.partition_key) is None
    # Retry: same frozen code version, new attempts; published intervals untouched.
    request_retry_failed(actor=personas["oscar"], request_id=request.pk)
    ready.drain()
    request.refresh_from_db()
    assert request.status == RequestStatus.RECONCILING
    assert {r.attempts.count() for r in Run.objects.filter(request=request)} == {3}


def api_client(user):
    from rest_framework.test import APIClient

    client = APIClient()
    client.force_authenticate(user)
    return client


def test_a_failed_request_can_be_given_up_with_a_reason(personas, ready, warehouse):
    """The exploratory test: a failed request that a retry cannot fix could not be
    cancelled (409 'it cannot become cancelled'), nor rolled back when it published
    nothing: it stayed failed for good. Now on-call cancels it; its failed intervals end."""
    from django.test import Client

    from backfill_portal.core.models import AuditEvent

    request = crashing_request(personas, ready, max_attempts=1)
    assert request.status == RequestStatus.FAILED
    client = Client()
    client.force_login(personas["oscar"])
    page = client.get(f"/requests/{request.pk}/").content.decode()
    assert f'action="/requests/{request.pk}/cancel/"' in page
    assert client.post(f"/requests/{request.pk}/cancel/", {"reason": "the source is gone"}).status_code == 302
    request.refresh_from_db()
    assert request.status == RequestStatus.CANCELLED
    assert set(Interval.objects.filter(request=request).values_list("status", flat=True)) == {IntervalStatus.CANCELLED}
    assert AuditEvent.objects.filter(request_id=request.pk, action="request.cancel", from_state="failed",
                                     reason="the source is gone", actor_name="oscar").exists()
    assert not ready.sent
    # Its reconciliation lists the cancelled intervals as not run on purpose, not as
    # "unexplained" (the exploratory test found a cancelled request showing 52 of them).
    body = api_client(personas["audrey"]).get(f"/api/requests/{request.pk}/reconciliation/").json()
    assert {r["status"] for r in body["rows"]} == {"skipped"}
    assert len(body["manifest"]["exceptions"]["cancelled"]) == 2


def test_cancel_stops_queued_runs_and_nothing_becomes_visible(personas, ready, warehouse):
    request = approved_request(personas, start="2022-10-01", end="2022-10-03")
    ready.drain(limit=1)  # dispatch only: runs queued
    backfill_request_cancel(actor=personas["oscar"], request_id=request.pk, reason="wrong range")
    ready.drain()
    assert set(Run.objects.filter(request=request).values_list("status", flat=True)) == {RunStatus.CANCELLED}
    assert set(Interval.objects.filter(request=request).values_list("status", flat=True)) == {IntervalStatus.CANCELLED}
    for key in ("2022-10-01", "2022-10-02", "2022-10-03"):
        assert warehouse.current("dwd_order_items", key) is None
    # What the cancel stopped is oscar's, with his reason (it was "system", "request
    # cancelled": an auditor could not tell who stopped the runs).
    stopped = AuditEvent.objects.filter(request_id=request.pk, action__in=["run.cancelled", "interval.cancelled"])
    assert stopped.count() >= 4
    assert {(e.actor.username if e.actor else None, e.reason) for e in stopped} == {
        ("oscar", "request cancelled: wrong range")}
    # Its page says so, not "waiting for a worker" (the auditor's QA).
    from django.test import Client

    client = Client()
    client.force_login(personas["audrey"])
    page = client.get(f"/runs/{Run.objects.filter(request=request).first().run_id}/").content.decode()
    assert "by oscar: “request cancelled: wrong range”" in page
    assert "cancelled before a worker took it" in page and "waiting for a worker" not in page


def test_template_that_fails_to_render_fails_the_attempt_with_the_error_stored(personas, ready, warehouse):
    request = approved_request(personas, start="2022-10-01", end="2022-10-01")
    run_sql = "SELECT order_id FROM {{ ref('ods_order_events') }} AS e WHERE {{ undefined_variable }}"
    from backfill_portal.catalog.models import CodeVersion

    cv = CodeVersion.objects.get(pk=Interval.objects.get(request=request).code_version_id)
    CodeVersion.objects.filter(pk=cv.pk).update(definition={**cv.definition, "sql": run_sql})
    ready.drain()
    run = Run.objects.get(request=request)
    assert run.status == RunStatus.FAILED
    assert "undefined_variable" in run.error
    assert all(a.error for a in run.attempts.all())
    assert warehouse.current("dwd_order_items", "2022-10-01") is None


@ALSO_ON_ICEBERG
def test_downstream_pins_the_upstream_versions_it_read(personas, ready, warehouse):
    approved_request(personas, start="2022-10-01", end="2022-10-01")
    ready.drain()
    upstream_run = Run.objects.get(job__name="dwd_order_items", status=RunStatus.PUBLISHED)
    dws = approved_request(personas, job="dws_sales_daily", start="2022-10-01", end="2022-10-01", approver="sam")
    ready.drain()
    run = Run.objects.get(request=dws)
    pin = Consumption.objects.get(run=run, dataset__name="dwd_order_items")
    assert pin.version.run == upstream_run and pin.partition_key == "2022-10-01"
    total = sum(r["gmv"] for r in published_rows(warehouse, "dws_sales_daily", "2022-10-01"))
    upstream_total = sum(float(r["amount"]) for r in published_rows(warehouse, "dwd_order_items", "2022-10-01"))
    assert round(float(total), 2) == pytest.approx(round(upstream_total, 2), abs=0.05)
    measure = CheckResult.objects.get(run=run, name="measure_vs_source")
    assert measure.passed and measure.blocking
    # The check rendered ref() against the pinned upstream version: its number is that
    # version's total, and the rollup's own total agrees with it.
    assert measure.observed["source"] == pytest.approx(upstream_total, abs=0.01)
    assert measure.observed["version"] == pytest.approx(float(total), abs=0.01)
    # The chained audit log itself says what was built from what, and by which code:
    # the publication's row names the pinned input and the fingerprint, the creation's
    # the code's hash (an edited consumption row could not be noticed before).
    published = AuditEvent.objects.get(action="run.published", object_id=str(run.pk))
    assert f"dwd_order_items/2022-10-01@{upstream_run.run_id}" in published.data["read"]
    assert published.data["fingerprint"] == run.version.fingerprint
    created = AuditEvent.objects.get(action="run.created", object_id=str(run.pk))
    assert created.data["code_hash"] == run.code_version.hash
    # The audit page names the run by its run id, linked, and unfolds what the row
    # recorded (it showed "run:220" and hid the data: the auditor's QA).
    from django.test import Client

    client = Client()
    client.force_login(personas["audrey"])
    page = client.get("/audit/", {"request": dws.pk, "action": "run.published"}).content.decode()
    assert f'<a href="/runs/{run.run_id}/">{run.run_id}</a>' in page
    assert f"dwd_order_items/2022-10-01@{upstream_run.run_id}" in page and "<summary>data</summary>" in page


@ALSO_ON_ICEBERG
def test_a_rollup_whose_measure_disagrees_with_its_source_is_not_published(personas, ready, warehouse):
    from backfill_portal.catalog.services.sync import catalog_sync
    from tests.conftest import TEST_CATALOG

    approved_request(personas, start="2022-10-01", end="2022-10-01")
    ready.drain()
    # A code change that loses every item without a category in one bucket: keys stay
    # unique and non-NULL, only the money no longer adds up.
    losing = TEST_CATALOG.replace("FROM {{ ref('dwd_order_items') }} AS d GROUP BY category",
                                  "FROM {{ ref('dwd_order_items') }} AS d WHERE category <> 'books' GROUP BY category")
    assert losing != TEST_CATALOG
    catalog_sync(text=losing)
    request = approved_request(personas, job="dws_sales_daily", start="2022-10-01", end="2022-10-01", approver="sam")
    ready.drain()
    run = Run.objects.get(request=request)
    assert run.status == RunStatus.VERIFICATION_FAILED
    measure = CheckResult.objects.get(run=run, name="measure_vs_source")
    assert not measure.passed and measure.observed["version"] < measure.observed["source"]
    assert warehouse.current("dws_sales_daily", "2022-10-01") is None


def test_run_and_partition_api_show_attempts_checks_pins_version_and_history(personas, ready, warehouse, api):
    approved_request(personas, start="2022-10-01", end="2022-10-01")
    ready.drain()
    second = approved_request(personas, start="2022-10-01", end="2022-10-01")
    ready.drain()
    run = Run.objects.get(request=second)
    body = api("audrey").get(f"/api/runs/{run.run_id}/").json()
    assert body["status"] == "published" and body["attempts"][0]["status"] == "succeeded"
    checks = {c["name"]: c for c in body["checks"]}
    assert checks["unique_business_key"]["observed"]["duplicate_keys"] == 0
    assert body["pinned_inputs"][0]["dataset"] == "ods_order_events"
    assert body["pinned_inputs"][0]["watermark"]["row_count"] > 0
    assert body["version"]["row_count"] > 0 and len(body["version"]["fingerprint"]) >= 16
    assert body["publications"][0]["previous_run_id"] == body["expected_previous_run_id"] != ""
    part = api("audrey").get("/api/datasets/dwd_order_items/partitions/2022-10-01/").json()
    assert part["current_run_id"] == run.run_id
    assert [p["run_id"] for p in part["publications"]][:2] == [run.run_id, body["expected_previous_run_id"]]
    assert api("audrey").get("/api/datasets/dwd_order_items/partitions/1999-01-01/").status_code == 404
    assert api("audrey").get("/api/runs/run_nope/").status_code == 404
    # Listed by the dataset they write, as the runs page filters (the API ignored ?dataset=).
    written = api("audrey").get("/api/runs/", {"dataset": "dwd_order_items"}).json()["results"]
    assert {r["run_id"] for r in written} == set(Run.objects.filter(job__dataset__name="dwd_order_items")
                                                 .values_list("run_id", flat=True))
    assert api("audrey").get("/api/runs/", {"dataset": "no_such"}).json()["results"] == []


def test_scheduler_creates_one_production_run_per_scheduled_job_and_closed_interval(personas, ready, warehouse):
    from datetime import datetime, timezone as tz

    from backfill_portal.execution.choices import RunType
    from backfill_portal.execution.services.schedule import schedule_production

    Job.objects.filter(name="dwd_order_items").update(scheduled=True)
    now = datetime(2022, 10, 3, 2, 0, tzinfo=tz.utc)  # 10:00 in Shanghai: 2022-10-02 is the latest closed day
    created = schedule_production(now=now)
    assert schedule_production(now=now) == []  # once
    run = Run.objects.get(run_id=created[0])
    assert (run.run_type, run.partition_key, run.request_id) == (RunType.SCHEDULED, "2022-10-02", None)
    assert ready.sent[0][3] == "production"  # its own queue, ahead of backfill work
    ready.drain()
    run.refresh_from_db()
    assert run.status == RunStatus.PUBLISHED
    assert warehouse.current("dwd_order_items", "2022-10-02") == run.run_id


def test_every_audit_row_of_a_cascades_intervals_attempts_and_runs_names_its_own_dataset(personas, ready, warehouse):
    """The auditor QA: the audit log's dataset filter missed an interval's own rows
    (queued, running, published, failed, skipped): they named no dataset."""
    request = approved_request(personas, start="2022-10-01", end="2022-10-02", cascade="cascade",
                               node_actions={"monthly_summary": "skip"})
    ready.drain()
    request.refresh_from_db()
    assert request.status == RequestStatus.RECONCILING, request.status
    dataset_of = {str(i.pk): i.job.dataset.name for i in Interval.objects.filter(request=request).select_related(
        "job__dataset")}
    assert len(set(dataset_of.values())) > 1  # a cascade: intervals of several datasets
    rows = AuditEvent.objects.filter(request_id=request.pk, object_type="interval")
    assert {row.to_state for row in rows} >= {IntervalStatus.QUEUED, IntervalStatus.RUNNING, IntervalStatus.PUBLISHED,
                                               IntervalStatus.SKIPPED}
    assert [(row.object_id, row.to_state) for row in rows if row.dataset != dataset_of[row.object_id]] == []
    runs = {str(run.pk): run.job.dataset.name for run in Run.objects.filter(request=request).select_related(
        "job__dataset")}
    run_rows = AuditEvent.objects.filter(request_id=request.pk, object_type="run")
    assert run_rows and [row.action for row in run_rows if row.dataset != runs[row.object_id]] == []
    assert not AuditEvent.objects.filter(request_id=request.pk, object_type="attempt", dataset="").exists()
