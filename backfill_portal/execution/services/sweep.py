"""The periodic sweep: the repairs that keep work moving when a worker, its link or the
broker failed. Each repair audits itself (a lost attempt is a transition); one audit
row per sweep that found work sums them up, so the repairs can be counted from the
database by any process (the `backfill_sweeper_actions_total` metric)."""
from __future__ import annotations

import os
import socket

from django.db import transaction

from backfill_portal.core.services.audit import audit_record
from backfill_portal.execution.queue import outbox_resend
from backfill_portal.execution.services.dispatch import dispatch_all, runs_resend_stale
from backfill_portal.execution.services.runs import attempts_sweep_lost

SWEEP_ACTION = "sweep.repaired"
# lost: attempts whose heartbeat expired; resent: outbox rows never sent; stale_runs:
# runs whose task a broker lost, sent again; dispatched: runs created by the periodic
# dispatch (free slots nobody else filled).
SWEEP_COUNTS = ("lost", "resent", "stale_runs", "dispatched")


def sweep_run(*, actor=None, now=None) -> dict:
    """1. Mark attempts with an expired heartbeat lost (each retried or failed by policy).
    2. Send outbox rows that were committed but never sent.
    3. Re-send the next task of runs waiting longer than any healthy queue would.
    4. Dispatch every running request (fills slots nobody filled).
    5. If any of these did something, one audit row with the four counts.
    `now` moves the clock the expiries are judged by (tests, and a manual sweep)."""
    counts = {"lost": attempts_sweep_lost(now=now), "resent": outbox_resend(),
              "stale_runs": runs_resend_stale(now=now), "dispatched": dispatch_all()}
    if any(counts.values()):
        with transaction.atomic():
            audit_record(actor=actor, action=SWEEP_ACTION, object_type="sweep",
                         object_id=f"{socket.gethostname()}:{os.getpid()}"[:64], data=counts)
    return counts
