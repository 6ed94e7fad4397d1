"""The periodic sweep: the repairs that keep work moving when a worker, its link or the
broker failed. Each repair audits itself (a lost attempt is a transition); one audit
row per sweep that found work sums them up, so the repairs can be counted from the
database by any process (the `backfill_sweeper_actions_total` metric).

A request whose state committed but whose hand-off never ran (the process died
between the commit and its on-commit work, or the broker lost the message) is found
after SWEEP_GRACE_SECONDS and given the same service the hand-off would have called
(or, for reconciliation, which lives above this layer, the same task, sent by name).
Each claims before it works, so a second sweep, or the hand-off arriving late, finds
the work done and does nothing."""
from __future__ import annotations

import logging
import os
import socket
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from backfill_portal.backfills.choices import Cascade
from backfill_portal.backfills.choices import IntervalStatus as I
from backfill_portal.backfills.choices import RequestStatus as R
from backfill_portal.backfills.models import BackfillRequest, HandoffItem, Interval, Reconciliation
from backfill_portal.backfills.services.handoff import handoffs_open_for
from backfill_portal.backfills.services.requests import request_start_after_approval
from backfill_portal.catalog.models import Job
from backfill_portal.core.models import AuditEvent
from backfill_portal.core.services.audit import audit_record
from backfill_portal.execution.lineage_out.outbox import lineage_events_resend
from backfill_portal.execution.models import Run, TaskOutbox
from backfill_portal.execution.queue import enqueue, outbox_resend
from backfill_portal.execution.services.dispatch import (
    dispatch_all,
    request_stop_runs,
    runs_resend_stale,
    warehouse_probe_and_resume,
)
from backfill_portal.execution.services.runs import attempts_sweep_lost
from backfill_portal.execution.services.verify import runs_reclaim_verifying
from backfill_portal.execution.transitions import RUN_ACTIVE

logger = logging.getLogger(__name__)

SWEEP_ACTION = "sweep.repaired"
RECONCILE_TASK = "backfills.reconcile_request"
# lost: attempts whose heartbeat expired; verifying: verifications whose beat stopped,
# handed back; stopped: cancelled requests whose runs nobody stopped; resent: outbox
# rows never sent; stale_runs: runs whose task a broker lost, sent again; resumed: work
# sent again when the warehouse came back from an outage; started: approved requests
# nobody started; dispatched: runs created by the periodic dispatch (free slots
# nobody else filled); reconciled: reconciling requests whose lost reconcile message
# was sent again; handoffs: hand-off cascades whose items were never opened.
SWEEP_COUNTS = ("lost", "verifying", "stopped", "resent", "stale_runs", "resumed", "started", "dispatched",
                "reconciled", "handoffs", "lineage")
_BATCH = 200


def sweep_run(*, actor=None, now=None) -> dict:
    """1. Mark attempts with an expired heartbeat lost (each retried or failed by policy).
    2. Hand back verifications whose beat stopped (their verifier died), to verify again.
    3. Stop the runs of cancelled requests nobody stopped (before 5 would send them again).
    4. Send outbox rows that were committed but never sent.
    5. Re-send the next task of runs whose message a broker lost.
    6. With a warehouse outage open, probe it; once it answers, send again what waited.
    7. Start approved requests nobody started.
    8. Dispatch every running request (fills slots nobody filled; a request with no
       work left moves on to reconciling or failed).
    9. Send again the reconcile task of reconciling requests whose message was lost.
    10. Open the items of hand-off cascades that never opened them.
    11. Send again the OpenLineage events nobody sent (a crash, a receiver that was down).
    12. If any of these did something, one audit row with the counts.
    `now` moves the clock the expiries are judged by (tests, and a manual sweep)."""
    counts = {"lost": attempts_sweep_lost(now=now), "verifying": runs_reclaim_verifying(now=now),
              "stopped": requests_stop_cancelled(now=now), "resent": outbox_resend(),
              "stale_runs": runs_resend_stale(now=now), "resumed": warehouse_probe_and_resume(),
              "started": requests_start_approved(now=now), "dispatched": dispatch_all(),
              "reconciled": requests_reconcile_lost(now=now), "handoffs": handoffs_open_lost(now=now),
              "lineage": lineage_events_resend(now=now)}
    if any(counts.values()):
        with transaction.atomic():
            audit_record(actor=actor, action=SWEEP_ACTION, object_type="sweep",
                         object_id=f"{socket.gethostname()}:{os.getpid()}"[:64], data=counts)
    return counts


def _cutoff(now):
    return (now or timezone.now()) - timedelta(seconds=settings.SWEEP_GRACE_SECONDS)


def _entered(request_id: int, state: str):
    """When the request last entered `state` (its transition's audit row), or None."""
    return (AuditEvent.objects.filter(object_type="request", object_id=str(request_id), to_state=state)
            .order_by("-id").values_list("at", flat=True).first())


def requests_start_approved(*, now=None) -> int:
    """Approved requests the hand-off after the approval never started (the process
    died after the approval committed). `request_start_after_approval` claims the
    request (approved -> running) under its row lock: a late hand-off, or a second
    sweep, finds it running and does nothing. Returns how many it started."""
    cutoff = _cutoff(now)
    stuck = (BackfillRequest.objects.filter(status=R.APPROVED)
             .filter(Q(decided_at__lt=cutoff) | Q(decided_at__isnull=True)).order_by("pk"))
    started = 0
    for pk in stuck.values_list("pk", flat=True)[:_BATCH]:
        if request_start_after_approval(request_id=pk):
            logger.warning("request %s was approved but never started; the sweeper started it", pk)
            started += 1
    return started


def requests_stop_cancelled(*, now=None) -> int:
    """Cancelled requests whose runs nobody stopped (the process died after the cancel
    committed): their queued runs would hold gate slots and be re-sent for ever. Every
    run and interval it stops is a conditional claim, so what a late hand-off or a
    second sweep finds is nothing left to stop. Returns how many requests it stopped."""
    cutoff = _cutoff(now)
    active_runs = Run.objects.filter(request=OuterRef("pk"), status__in=RUN_ACTIVE)
    open_intervals = Interval.objects.filter(request=OuterRef("pk"), status__in=[I.QUEUED, I.RUNNING, I.FAILED])
    stuck = (BackfillRequest.objects.filter(status=R.CANCELLED)
             .filter(Q(finished_at__lt=cutoff) | Q(finished_at__isnull=True))
             .filter(Exists(active_runs) | Exists(open_intervals)).order_by("pk"))
    stopped = 0
    for pk in stuck.values_list("pk", flat=True)[:_BATCH]:
        if request_stop_runs(request_id=pk):
            logger.warning("request %s was cancelled but its runs went on; the sweeper stopped them", pk)
            stopped += 1
    return stopped


def _reconcile_in_flight(request_id: int, cutoff) -> bool:
    """A reconcile message for the request sent (or, unsent, written) since `cutoff`:
    it may still be on its way or running. One never sent and older is the outbox
    sweep's (step 3), or lost with a broker that refuses it."""
    return (TaskOutbox.objects.filter(task=RECONCILE_TASK, headers__request_id=request_id)
            .filter(Q(sent_at__gte=cutoff) | Q(sent_at__isnull=True, created_at__gte=cutoff)).exists())


def requests_reconcile_lost(*, now=None) -> int:
    """Reconciling requests with no reconciliation and no reconcile message in flight,
    that entered reconciling before the grace time: their message was lost (a broker
    that lost it, a worker killed while it ran). The message is sent again, by name as
    execution sends work up to recovery; the claim is the request's row, held while
    the check and the new outbox row commit, so a concurrent sweep skips it and a later
    one finds the fresh message in flight. Returns how many it sent."""
    cutoff = _cutoff(now)
    missing = ~Exists(Reconciliation.objects.filter(request=OuterRef("pk")))
    sent = 0
    for pk in (BackfillRequest.objects.filter(missing, status=R.RECONCILING).order_by("pk")
               .values_list("pk", flat=True)[:_BATCH]):
        entered = _entered(pk, R.RECONCILING)
        if entered is not None and entered >= cutoff:
            continue
        with transaction.atomic():
            claimed = (BackfillRequest.objects.select_for_update(skip_locked=True)
                       .filter(missing, pk=pk, status=R.RECONCILING).values_list("pk", flat=True).first())
            if claimed is None or _reconcile_in_flight(pk, cutoff):
                continue  # another sweeper holds it, it moved on, or its message may be on its way
            enqueue(RECONCILE_TASK, pk, headers={"request_id": pk})
        logger.warning("request %s was reconciling with no reconciliation; the sweeper sent its reconcile task", pk)
        sent += 1
    return sent


def handoffs_open_lost(*, now=None) -> int:
    """Hand-off cascades that reached reconciling without opening their items (the
    process died after the commit, before its on-commit work): each direct consumer's
    owner would never be asked. `handoffs_open_for` makes an item at most once per
    (request, job) (a unique constraint), so a late hand-off or a second sweep opens
    nothing more. Returns how many requests it opened items for."""
    cutoff = _cutoff(now)
    consumers = Job.objects.filter(upstreams=OuterRef("job__dataset")).exclude(has_side_effects=True)
    stuck = (BackfillRequest.objects.filter(cascade=Cascade.HANDOFF, status__in=[R.RECONCILING, R.COMPLETED])
             .filter(Exists(consumers), ~Exists(HandoffItem.objects.filter(request=OuterRef("pk")))).order_by("pk"))
    opened = 0
    for pk in stuck.values_list("pk", flat=True)[:_BATCH]:
        entered = _entered(pk, R.RECONCILING)
        if entered is not None and entered >= cutoff:
            continue
        before = HandoffItem.objects.filter(request_id=pk).count()
        handoffs_open_for(request_id=pk)
        if HandoffItem.objects.filter(request_id=pk).count() > before:
            logger.warning("hand-off request %s never opened its items; the sweeper opened them", pk)
            opened += 1
    return opened
