"""The owner of `LineageEvent`: writing a run's events with its transitions, sending
them after commit, sending again what a crash or a receiver that was down left unsent.

Neither lost nor sent twice beyond what a receiver deduplicates:

* the event row is written in the transition's own transaction, so it exists exactly
  when the transition committed (a rolled-back transition leaves none);
* its sending is a task enqueued through the outbox (`core/outbox.py`) in the same
  transaction; the task sends the run's unsent events in order, each under a lease
  (a conditional UPDATE), so two deliveries of the task do not both send one event;
* a send that fails leaves the event unsent with a backoff; a sender that dies leaves
  its lease to expire; either way the sweeper sends it again (`lineage_events_resend`);
* the payload was fixed when written, so the one duplicate left possible (a sender
  that died after the receiver accepted, before it marked the event sent) is the same
  bytes: same run id, event type and event time.

Retention (`recovery/retention.py`) deletes events delivered long ago through
`lineage_events_purge_delivered`; an undelivered event is never deleted.
"""
from __future__ import annotations

import logging
import random
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Max, Q
from django.utils import timezone

from backfill_portal.core.outbox import BACKFILL_QUEUE, PRODUCTION_QUEUE, enqueue
from backfill_portal.core.rows import insert_row
from backfill_portal.core.services.audit import delete_audited_in_batches
from backfill_portal.execution.choices import RunStatus as S
from backfill_portal.execution.choices import RunType
from backfill_portal.execution.lineage_out.events import Transition, run_event
from backfill_portal.execution.lineage_out.transport import lineage_enabled, lineage_transport
from backfill_portal.execution.models import CheckResult, LineageEvent, Run

logger = logging.getLogger(__name__)

SEND_TASK = "execution.send_lineage_events"
TERMINAL_EVENTS = frozenset({"COMPLETE", "FAIL", "ABORT"})
LEASE_SECONDS = 60
BACKOFF_SECONDS, BACKOFF_MAX_SECONDS = 5.0, 600.0


def event_type_for(run: Run, transition: Transition) -> str | None:
    """Which event a run transition emits (docs/openlineage.md has the table); None:
    none. A run whose events are closed (nothing yet, or its last was COMPLETE, FAIL or
    ABORT: a failed run retried) STARTs anew; a later attempt of an open run is RUNNING."""
    before, to = transition.before, transition.to
    if to == S.RUNNING and before == S.QUEUED:
        last = LineageEvent.objects.filter(run=run).order_by("-id").values_list("event_type", flat=True).first()
        return "START" if last is None or last in TERMINAL_EVENTS else "RUNNING"
    if to == S.PUBLISHED:
        return "COMPLETE" if before == S.VERIFIED else "OTHER"  # else: restored by a rollback
    if to == S.ROLLED_BACK:
        return "OTHER"
    if to in (S.FAILED, S.VERIFICATION_FAILED):
        return "FAIL"
    if to == S.CANCELLED:
        # A second-rerun verification run is retired (cancelled) once it proved its
        # original: it did its work. Any other cancel stopped one.
        proved = (run.run_type == RunType.VERIFICATION
                  and CheckResult.objects.filter(run=run, name="second_rerun", passed=True).exists())
        return "COMPLETE" if proved else "ABORT"
    return None


def lineage_transition(run: Run, transition: Transition) -> LineageEvent | None:
    """Record the event `transition` emits, if any, in the caller's transaction, and
    enqueue its sending after commit. Nothing at all while lineage is off."""
    if not lineage_enabled():
        return None
    event_type = event_type_for(run, transition)
    if event_type is None:
        return None
    payload = run_event(run, event_type=event_type, transition=transition, now=timezone.now())
    with transaction.atomic(savepoint=False):
        event = insert_row(LineageEvent(run=run, event_type=event_type, payload=payload))
        enqueue(SEND_TASK, event.pk, queue=PRODUCTION_QUEUE if run.run_type == RunType.SCHEDULED else BACKFILL_QUEUE)
    return event


def lineage_events_send(*, event_id: int) -> str:
    """Send the unsent events of `event_id`'s run up to it, oldest first; stop at the
    first that cannot be sent (so a receiver sees a run's events in order)."""
    event = LineageEvent.objects.filter(pk=event_id).only("run_id", "sent_at").first()
    if event is None:
        return "missing"
    if event.sent_at is not None:
        return "already-sent"
    transport = lineage_transport()
    if transport is None:
        return "lineage-off"  # left unsent: sent if lineage is switched on again
    try:
        pending = LineageEvent.objects.filter(run_id=event.run_id, sent_at__isnull=True, pk__lte=event_id).order_by("id")
        for pk in pending.values_list("pk", flat=True):
            outcome = _send_one(pk, transport)
            if outcome != "sent":
                return outcome
    finally:
        transport.close()
    return "sent"


def _send_one(pk: int, transport) -> str:
    now = timezone.now()
    lease = now + timedelta(seconds=LEASE_SECONDS)
    claimed = LineageEvent.objects.filter(
        Q(claimed_until__isnull=True) | Q(claimed_until__lt=now), pk=pk, sent_at__isnull=True,
    ).update(claimed_until=lease)
    if claimed != 1:
        return "claimed-elsewhere"  # another sender has it, or sent it meanwhile
    event = LineageEvent.objects.get(pk=pk)
    try:
        transport.emit(event.payload)
    except Exception as exc:
        tries = event.tries + 1
        delay = min(BACKOFF_MAX_SECONDS, BACKOFF_SECONDS * 2 ** min(tries - 1, 16)) * random.uniform(0.5, 1.0)
        LineageEvent.objects.filter(pk=pk, claimed_until=lease).update(
            claimed_until=None, tries=tries, last_error=f"{type(exc).__name__}: {exc}"[:2000],
            next_try_at=timezone.now() + timedelta(seconds=delay))
        logger.warning("lineage event %s (%s) not sent (%s); trying again in %.0f s", pk, event.event_type, exc, delay)
        return "failed"
    LineageEvent.objects.filter(pk=pk, claimed_until=lease).update(
        sent_at=timezone.now(), claimed_until=None, tries=event.tries + 1, last_error="")
    return "sent"


def lineage_events_resend(*, now=None, older_than_seconds: int | None = None) -> int:
    """The sweeper's part: enqueue the sending again for every run with an event that
    is unsent, due (its backoff over), not under a live lease and older than
    `older_than_seconds` (SWEEP_GRACE_SECONDS: its send after commit may be under way).
    Returns how many runs."""
    if not lineage_enabled():
        return 0
    now = now or timezone.now()
    grace = settings.SWEEP_GRACE_SECONDS if older_than_seconds is None else older_than_seconds
    due = (LineageEvent.objects.filter(sent_at__isnull=True, created_at__lt=now - timedelta(seconds=grace))
           .filter(Q(next_try_at__isnull=True) | Q(next_try_at__lte=now))
           .filter(Q(claimed_until__isnull=True) | Q(claimed_until__lt=now))
           .values("run_id").annotate(last=Max("id")).values_list("last", flat=True)[:500])
    lasts = list(due)
    with transaction.atomic():
        for pk in lasts:
            enqueue(SEND_TASK, pk)
    return len(lasts)



def lineage_events_purge_delivered(*, sent_before, keep_runs_in=(), actor=None, reason: str = "") -> int:
    """Delete the events sent before `sent_before`, except those of runs whose status is
    in `keep_runs_in` (an open run's last event decides whether its next start is a
    START or a RUNNING); an unsent event is never deleted. In batches, each with its
    audit row (how many, which ids). Returns how many."""
    return delete_audited_in_batches(
        LineageEvent.objects.filter(sent_at__isnull=False, sent_at__lt=sent_before)
        .exclude(run__status__in=list(keep_runs_in)),
        action="lineage_event.purge", object_type="lineage_event", counted_as="events", actor=actor, reason=reason,
        data={"sent_before": sent_before.isoformat()})
