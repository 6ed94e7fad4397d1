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
from backfill_portal.execution.services.dispatch import dispatch_all, runs_resend_stale, warehouse_probe_and_resume
from backfill_portal.execution.services.runs import attempts_sweep_lost
from backfill_portal.execution.services.verify import runs_reclaim_verifying

SWEEP_ACTION = "sweep.repaired"
# lost: attempts whose heartbeat expired; verifying: verifications whose beat stopped,
# handed back; resent: outbox rows never sent; stale_runs: runs whose task a broker
# lost, sent again; resumed: work sent again when the warehouse came back from an
# outage; dispatched: runs created by the periodic dispatch (free slots nobody else filled).
SWEEP_COUNTS = ("lost", "verifying", "resent", "stale_runs", "resumed", "dispatched")


def sweep_run(*, actor=None, now=None) -> dict:
    """1. Mark attempts with an expired heartbeat lost (each retried or failed by policy).
    2. Hand back verifications whose beat stopped (their verifier died), to verify again.
    3. Send outbox rows that were committed but never sent.
    4. Re-send the next task of runs whose message a broker lost.
    5. With a warehouse outage open, probe it; once it answers, send again what waited.
    6. Dispatch every running request (fills slots nobody filled).
    7. If any of these did something, one audit row with the counts.
    `now` moves the clock the expiries are judged by (tests, and a manual sweep)."""
    counts = {"lost": attempts_sweep_lost(now=now), "verifying": runs_reclaim_verifying(now=now),
              "resent": outbox_resend(), "stale_runs": runs_resend_stale(now=now),
              "resumed": warehouse_probe_and_resume(), "dispatched": dispatch_all()}
    if any(counts.values()):
        with transaction.atomic():
            audit_record(actor=actor, action=SWEEP_ACTION, object_type="sweep",
                         object_id=f"{socket.gethostname()}:{os.getpid()}"[:64], data=counts)
    return counts
