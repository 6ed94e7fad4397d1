"""A request whose state committed but whose hand-off never ran moves on by itself.

Each case is brought about the way a crash would: the service runs and commits, and
the process "dies" right after the commit (`died_after_commit`: the first on-commit
callback of the transaction raises, so the hand-off and the outbox sends registered
after it never run), or the broker loses the message. Then the sweeper, once the
grace time (SWEEP_GRACE_SECONDS) has passed, calls the service the hand-off would
have called; a second sweep, and the hand-off arriving late, change nothing. The same
against a real worker: test_worker.py."""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction
from django.utils import timezone

from backfill_portal.backfills.choices import IntervalStatus, RequestStatus
from backfill_portal.backfills.models import BackfillRequest, HandoffItem, Interval, Reconciliation, ReconciliationRow
from backfill_portal.backfills.services.handoff import handoffs_open_for
from backfill_portal.backfills.services.requests import (
    backfill_request_cancel,
    backfill_request_create,
    backfill_request_decide,
    backfill_request_submit,
)
from backfill_portal.core.models import AuditEvent
from backfill_portal.execution.choices import RunStatus
from backfill_portal.execution.models import Attempt, Run
from backfill_portal.backfills.services.lifecycle import request_pause, request_resume
from backfill_portal.backfills.services.requests import request_start_after_approval
from backfill_portal.execution.services.dispatch import dispatch_request, request_stop_runs
from backfill_portal.execution.services.sweep import (
    SWEEP_ACTION,
    SWEEP_COUNTS,
    requests_start_approved,
    requests_stop_cancelled,
    sweep_run,
)
from backfill_portal.recovery.reconciliation import reconciliation_signoff
from backfill_portal.recovery.tasks import reconcile_request
from backfill_portal.warehouse.models import Publication
from tests.execution.test_pipeline import approved_request
from tests.conftest import waiting_backends

pytestmark = pytest.mark.django_db(transaction=True)

LATER = timedelta(hours=1)
NOTHING = dict.fromkeys(SWEEP_COUNTS, 0)


class ProcessDied(Exception):
    """Stands for kill -9 right after a commit."""


@contextmanager
def died_after_commit():
    """Run the body in one transaction that commits, then 'die': on-commit work
    registered in it (hand-offs, outbox sends) never runs."""

    def die():
        raise ProcessDied

    with pytest.raises(ProcessDied):
        with transaction.atomic():
            transaction.on_commit(die)
            yield


@pytest.fixture
def ready(catalog, demo_sources, task_queue, warehouse):
    return task_queue


def sweep_later() -> dict:
    return sweep_run(actor=None, now=timezone.now() + LATER)


def submitted(personas, **kwargs):
    request, _ = backfill_request_create(actor=personas["alice"], job="dwd_order_items", reason="bug 4711 fixed",
                                         **{"start": "2022-10-01", "end": "2022-10-02", **kwargs})
    backfill_request_submit(actor=personas["alice"], request_id=request.pk, confirm_overlap=True)
    return request


def events(request, action: str) -> int:
    return AuditEvent.objects.filter(request_id=request.pk, action=action).count()


def last_sweep() -> dict:
    return AuditEvent.objects.filter(action=SWEEP_ACTION).latest("id").data


def assert_published_once(request, n: int) -> None:
    runs = list(Run.objects.filter(request=request))
    assert len(runs) == n and {r.status for r in runs} == {RunStatus.PUBLISHED}
    assert Publication.objects.filter(version__run__request=request).count() == n
    assert set(Interval.objects.filter(request=request).values_list("status", flat=True)) == {IntervalStatus.PUBLISHED}


def test_an_approved_request_nobody_started_is_started_by_the_sweeper_and_completes(personas, ready):
    request = submitted(personas)
    with died_after_commit():
        backfill_request_decide(actor=personas["olivia"], request_id=request.pk, approve=True)
    request.refresh_from_db()
    assert request.status == RequestStatus.APPROVED
    assert not Run.objects.filter(request=request).exists() and not ready.sent
    # Within the grace time the hand-off may merely be slow: nothing is done for it.
    assert sweep_run(actor=None)["started"] == 0
    request.refresh_from_db()
    assert request.status == RequestStatus.APPROVED

    counts = sweep_later()
    assert counts["started"] == 1 and counts["dispatched"] == 2
    assert last_sweep()["started"] == 1
    request.refresh_from_db()
    assert request.status == RequestStatus.RUNNING
    start = AuditEvent.objects.get(request_id=request.pk, action="request.start")
    assert (start.from_state, start.to_state, start.actor_id) == ("approved", "running", None)
    # The hand-off arriving late finds the request started and does nothing.
    assert request_start_after_approval(request_id=request.pk) is False
    ready.drain()
    request.refresh_from_db()
    assert request.status == RequestStatus.RECONCILING
    assert_published_once(request, 2)
    assert Reconciliation.objects.filter(request=request).exists()
    # A second sweep changes nothing.
    assert sweep_later() == NOTHING
    assert events(request, "request.start") == 1
    reconciliation_signoff(actor=personas["olivia"], request_id=request.pk)
    request.refresh_from_db()
    assert request.status == RequestStatus.COMPLETED


def test_a_cancelled_request_whose_runs_were_left_queued_is_stopped_by_the_sweeper(personas, ready, warehouse):
    request = approved_request(personas, start="2022-10-01", end="2022-10-03")
    ready.drain(skip=lambda task, args: task == "execution.execute_run")  # the runs wait in the broker
    runs = list(Run.objects.filter(request=request))
    assert len(runs) == 3 and {r.status for r in runs} == {RunStatus.QUEUED}
    with died_after_commit():
        backfill_request_cancel(actor=personas["alice"], request_id=request.pk, reason="wrong range")
    request.refresh_from_db()
    assert request.status == RequestStatus.CANCELLED
    assert set(Run.objects.filter(request=request).values_list("status", flat=True)) == {RunStatus.QUEUED}
    assert sweep_run(actor=None)["stopped"] == 0  # within the grace time

    counts = sweep_later()
    assert counts["stopped"] == 1 and counts["stale_runs"] == 0  # stopped, not sent again
    assert last_sweep()["stopped"] == 1
    assert set(Run.objects.filter(request=request).values_list("status", flat=True)) == {RunStatus.CANCELLED}
    assert set(Interval.objects.filter(request=request).values_list("status", flat=True)) == {IntervalStatus.CANCELLED}
    assert events(request, "run.cancelled") == 3
    # The late hand-off finds nothing left to stop; the messages still in the broker run nothing.
    assert request_stop_runs(request_id=request.pk) == 0
    ready.drain()
    assert not Attempt.objects.filter(run__request=request).exists()
    assert not Publication.objects.filter(version__run__request=request).exists()
    assert warehouse.current("dwd_order_items", "2022-10-01") is None
    assert sweep_later() == NOTHING
    assert events(request, "run.cancelled") == 3


def test_a_cancelled_request_with_a_staged_run_publishes_nothing_once_the_sweeper_stops_it(personas, ready, warehouse):
    request = approved_request(personas, start="2022-10-01", end="2022-10-01")
    ready.drain_to_staged()
    run = Run.objects.get(request=request)
    assert run.status == RunStatus.STAGED
    with died_after_commit():
        backfill_request_cancel(actor=personas["oscar"], request_id=request.pk, reason="source still wrong")
    assert sweep_later()["stopped"] == 1
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    ready.drain()  # the verify message arrives late: the run's state refuses it
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    assert not Publication.objects.filter(version__run=run).exists()
    assert warehouse.current("dwd_order_items", "2022-10-01") is None
    assert sweep_later() == NOTHING


def test_a_reconciling_request_whose_reconcile_message_was_lost_is_reconciled_by_the_sweeper(personas, ready):
    request = approved_request(personas, start="2022-10-01", end="2022-10-02")
    ready.drain(skip=lambda task, args: task == "backfills.reconcile_request")
    request.refresh_from_db()
    assert request.status == RequestStatus.RECONCILING
    assert not Reconciliation.objects.filter(request=request).exists()
    lost = [m for m in ready.sent if m[0] == "backfills.reconcile_request"]
    assert len(lost) == 1
    ready.sent.clear()  # the broker loses it (a Redis restarted without its data)
    # Sent just now: it may be on its way, so the sweeper waits.
    assert sweep_run(actor=None)["reconciled"] == 0
    assert not Reconciliation.objects.filter(request=request).exists()

    counts = sweep_later()
    assert counts["reconciled"] == 1 and last_sweep()["reconciled"] == 1
    assert [m[:2] for m in ready.sent] == [("backfills.reconcile_request", [request.pk])]
    assert sweep_run(actor=None)["reconciled"] == 0  # the new message is in flight: not sent twice
    ready.drain()
    reconciliation = Reconciliation.objects.get(request=request)
    assert reconciliation.manifest["verdicts"]["unexplained"] == 0
    assert ReconciliationRow.objects.filter(request=request).count() == 2
    assert events(request, "reconciliation.compute") == 1
    assert sweep_later() == NOTHING
    assert events(request, "reconciliation.compute") == 1
    # Had the message only been late, the task computes the same numbers again (it is
    # safe twice): the rows stay one per interval and the verdicts do not move.
    assert reconcile_request.apply(args=[request.pk]).get() == "computed"
    assert ReconciliationRow.objects.filter(request=request).count() == 2
    assert Reconciliation.objects.get(request=request).manifest["verdicts"] == reconciliation.manifest["verdicts"]
    reconciliation_signoff(actor=personas["olivia"], request_id=request.pk)
    request.refresh_from_db()
    assert request.status == RequestStatus.COMPLETED


def all_published_while_paused(personas, ready, **kwargs):
    """A running request whose every interval published while it was paused (dispatch
    leaves a paused request as it is), resumed by a process that died after the resume
    committed: nothing has moved it on."""
    request = approved_request(personas, start="2022-10-01", end="2022-10-02", **kwargs)
    ready.drain(skip=lambda task, args: task == "execution.execute_run")
    request_pause(actor=personas["alice"], request_id=request.pk)
    ready.drain()
    with died_after_commit():
        request_resume(actor=personas["alice"], request_id=request.pk)
    request.refresh_from_db()
    assert request.status == RequestStatus.RUNNING and not request.paused
    assert_published_once(request, 2)
    return request


def test_a_running_request_with_every_interval_published_moves_on_with_the_sweepers_dispatch(personas, ready):
    request = all_published_while_paused(personas, ready)
    sweep_run(actor=None)  # its periodic dispatch finds no work left
    request.refresh_from_db()
    assert request.status == RequestStatus.RECONCILING
    ready.drain()
    assert Reconciliation.objects.filter(request=request).exists()
    assert sweep_later() == NOTHING


def test_a_handoff_cascade_that_died_on_reaching_reconciling_gets_its_items_and_reconciliation(personas, ready):
    request = all_published_while_paused(personas, ready, cascade="handoff")
    # The worker that found no work left dies after committing `reconciling`: the
    # reconcile message (never sent) and the hand-off items (never opened) are lost.
    with died_after_commit():
        dispatch_request(request_id=request.pk)
    request.refresh_from_db()
    assert request.status == RequestStatus.RECONCILING
    assert not HandoffItem.objects.filter(request=request).exists()
    assert not Reconciliation.objects.filter(request=request).exists()
    counts = sweep_run(actor=None)
    assert counts["handoffs"] == 0 and counts["reconciled"] == 0  # within the grace time

    counts = sweep_later()
    assert counts["handoffs"] == 1 and counts["reconciled"] == 1
    item = HandoffItem.objects.get(request=request)
    assert (item.job.name, item.owner.username, item.status) == ("dws_sales_daily", "sam", HandoffItem.Status.PENDING)
    assert events(request, "handoff.open") == 1
    ready.drain()
    assert Reconciliation.objects.filter(request=request).exists()
    # The hand-off arriving late opens nothing more; neither does a second sweep.
    assert [i.pk for i in handoffs_open_for(request_id=request.pk)] == [item.pk]
    assert sweep_later() == NOTHING
    assert events(request, "handoff.open") == 1


# -- the sweeper and a late hand-off at the same moment (PostgreSQL) ----------------------



def race(request, *calls) -> tuple[list, list]:
    """Start every call while this test holds the request's row, wait until each is
    blocked on it, then let them go: a real race."""
    results, errors = [], []

    def run(call):
        try:
            results.append(call())
        except Exception as exc:  # noqa: BLE001 - reported by the caller
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(call,)) for call in calls]
    with transaction.atomic():
        list(BackfillRequest.objects.select_for_update().filter(pk=request.pk))
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while waiting_backends() < len(calls) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert waiting_backends() >= len(calls), "every caller should be waiting on the held request"
    for t in threads:
        t.join(30)
    return results, errors


@pytest.mark.skipif(connection.vendor != "postgresql", reason="needs PostgreSQL: concurrent transactions")
def test_the_sweeper_and_a_late_start_hand_off_at_once_start_the_request_once(personas, ready):
    request = submitted(personas)
    with died_after_commit():
        backfill_request_decide(actor=personas["olivia"], request_id=request.pk, approve=True)
    later = timezone.now() + LATER
    results, errors = race(request, lambda: requests_start_approved(now=later),
                           lambda: request_start_after_approval(request_id=request.pk))
    assert not errors, errors
    assert sorted(int(r) for r in results) == [0, 1]  # one started it, the other found it started
    assert events(request, "request.start") == 1
    ready.drain()
    request.refresh_from_db()
    assert request.status == RequestStatus.RECONCILING
    assert_published_once(request, 2)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="needs PostgreSQL: concurrent transactions")
def test_the_sweeper_and_a_late_stop_hand_off_at_once_stop_each_run_once(personas, ready):
    request = approved_request(personas, start="2022-10-01", end="2022-10-03")
    ready.drain(skip=lambda task, args: task == "execution.execute_run")
    with died_after_commit():
        backfill_request_cancel(actor=personas["alice"], request_id=request.pk, reason="wrong range")
    later = timezone.now() + LATER
    results, errors = race(request, lambda: requests_stop_cancelled(now=later),
                           lambda: request_stop_runs(request_id=request.pk))
    assert not errors, errors
    assert 0 in results and max(results) > 0  # one stopped them, the other found nothing left
    assert events(request, "run.cancelled") == 3
    assert set(Run.objects.filter(request=request).values_list("status", flat=True)) == {RunStatus.CANCELLED}


def test_a_cancel_leaves_a_verified_run_to_publish_and_its_interval_with_it(personas, ready, warehouse):
    """The exploratory test (on PostgreSQL, at load): a cancel that landed between a
    verified run's pointer switch and its metadata record cancelled the run, so the
    record failed and readers were left on a cancelled run's version with no publication
    in the portal. A verified run is complete and checked: the cancel leaves it to publish."""
    request = approved_request(personas, start="2022-10-01", end="2022-10-03")
    ready.drain(skip=lambda task, args: task == "execution.execute_run")
    runs = list(Run.objects.filter(request=request).order_by("pk"))
    # The first run as a publication leaves it: verified, its interval running (set directly:
    # the real one is a moment inside one task).
    Run.objects.filter(pk=runs[0].pk).update(status=RunStatus.VERIFIED)
    Interval.objects.filter(pk=runs[0].interval_id).update(status=IntervalStatus.RUNNING)
    backfill_request_cancel(actor=personas["oscar"], request_id=request.pk, reason="wrong range")
    statuses = dict(Run.objects.filter(request=request).values_list("pk", "status"))
    assert statuses == {runs[0].pk: RunStatus.VERIFIED, runs[1].pk: RunStatus.CANCELLED,
                        runs[2].pk: RunStatus.CANCELLED}
    intervals = dict(Interval.objects.filter(request=request).values_list("pk", "status"))
    assert intervals[runs[0].interval_id] == IntervalStatus.RUNNING
    assert sorted(v for k, v in intervals.items() if k != runs[0].interval_id) == [IntervalStatus.CANCELLED] * 2
    assert request_stop_runs(request_id=request.pk) == 0  # and a second stop leaves it too
