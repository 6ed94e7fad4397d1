"""Running one attempt of one run, heartbeats, fencing and the lost-attempt sweeper."""
from __future__ import annotations

import functools
import logging
import os
import random
import socket
import threading
from collections.abc import Callable
from datetime import timedelta

from django.conf import settings
from django.db import close_old_connections, connection, transaction
from django.db.models import Max
from django.utils import timezone

from backfill_portal.backfills.choices import IntervalStatus as I
from backfill_portal.backfills.choices import RequestStatus as R
from backfill_portal.backfills.transitions import interval_transition, intervals_transition
from backfill_portal.core.errors import ConflictError
from backfill_portal.core.logging import log_context
from backfill_portal.core.services.audit import audit_batch, audit_record
from backfill_portal.execution.anomalies import baseline_of, trailing_row_counts, trailing_row_counts_of
from backfill_portal.execution.choices import AttemptStatus as A
from backfill_portal.execution.choices import RunStatus as S
from backfill_portal.execution.choices import RunType
from backfill_portal.execution.models import Attempt, Run
from backfill_portal.execution.selectors import run_get, verification_original
from backfill_portal.execution.services.dispatch import enqueue_execute, enqueue_verify
from backfill_portal.execution.services.intervals import interval_fail_with_run
from backfill_portal.execution.transitions import attempt_transition, attempts_transition, run_transition, runs_transition
from backfill_portal.backends import AlreadyCommitted, get_warehouse
from backfill_portal.warehouse.models import Version
from backfill_portal.warehouse.services.outage import warehouse_outage_confirm, warehouse_outage_current

logger = logging.getLogger(__name__)


class Heartbeat:
    """Beats while work goes on: `beat()` is a conditional update that returns False
    once the work is no longer its owner's (an attempt marked lost, a verification
    reclaimed, the run cancelled); that sets `fenced`: the work must stop and its result
    will be refused. A beat that fails (the database restarting) is tried again at
    the next tick rather than ending the heartbeat: a healthy worker must not look
    dead because of one blip."""

    def __init__(self, attempt: Attempt | None = None, every: float = 15.0, *, beat=None, name: str = ""):
        if beat is None:
            attempt_pk = attempt.pk
            beat = lambda: attempt_heartbeat(attempt_pk=attempt_pk)  # noqa: E731
            name = name or f"heartbeat-{attempt_pk}"
        self.beat = beat
        self.every = max(0.2, every)
        self.fenced = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name or "heartbeat", daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=5)

    def _loop(self):
        try:
            while not self._stop.wait(self.every):
                try:
                    alive = self.beat()
                except Exception as exc:
                    logger.warning("heartbeat could not be written (%s); trying again", exc)
                    connection.close()
                    continue
                if not alive:
                    self.fenced.set()
                    return
        finally:
            connection.close()


def attempt_heartbeat(*, attempt_pk: int) -> bool:
    """A conditional update: a stale attempt's beat changes nothing and returns False."""
    return Attempt.objects.filter(pk=attempt_pk, status=A.RUNNING).update(heartbeat_at=timezone.now()) == 1


def attempt_start(run: Run, worker: str) -> Attempt | None:
    """Claim a queued run (queued -> running) and open its next attempt, in one
    transaction (inside a caller's, a savepoint of it); None when another delivery
    claimed the run first."""
    with transaction.atomic(), audit_batch():
        try:
            run_transition(run, to=S.RUNNING, updates={"started_at": run.started_at or timezone.now()})
        except ConflictError:
            return None  # another delivery of this task claimed it first
        attempt = _insert_next_attempt(run, worker)
        audit_record(actor=None, action="attempt.started", object_type="attempt", object_id=attempt.pk,
                     request_id=run.request_id, dataset=run.job.dataset.name, to_state=A.RUNNING,
                     data={"run_id": run.run_id, "attempt_no": attempt.attempt_no, "worker": worker})
        if run.interval_id and run.interval.status == I.QUEUED:
            interval_transition(run.interval, to=I.RUNNING, data={"run_id": run.run_id}, dataset=run.job.dataset.name)
    return attempt


def attempts_start(runs: list[Run], worker: str) -> list[Attempt]:
    """`attempt_start` for several queued runs of one job at once (a bundle's first
    step): one conditional UPDATE claims them, one INSERT opens their attempts, one
    UPDATE moves their intervals, each with the audit rows it gets alone. All or
    nothing, inside the caller's savepoint: ConflictError when any run was claimed
    elsewhere (each then goes through `attempt_start` alone)."""
    now = timezone.now()
    runs_transition(runs, to=S.RUNNING, updates={"started_at": lambda run: run.started_at or now})
    last = dict(Attempt.objects.filter(run__in=runs).values_list("run_id").annotate(last=Max("attempt_no"))
                .values_list("run_id", "last"))
    attempts = Attempt.objects.bulk_create([
        Attempt(run=run, attempt_no=last.get(run.pk, 0) + 1, status=A.RUNNING, started_at=now, heartbeat_at=now,
                worker=worker) for run in runs])
    for run, attempt in zip(runs, attempts):
        audit_record(actor=None, action="attempt.started", object_type="attempt", object_id=attempt.pk,
                     request_id=run.request_id, dataset=run.job.dataset.name, to_state=A.RUNNING,
                     data={"run_id": run.run_id, "attempt_no": attempt.attempt_no, "worker": worker})
    run_of = {run.interval_id: run for run in runs if run.interval_id and run.interval.status == I.QUEUED}
    intervals_transition([run.interval for run in run_of.values()], to=I.RUNNING,
                         data=lambda interval: {"run_id": run_of[interval.pk].run_id},
                         dataset=lambda interval: run_of[interval.pk].job.dataset.name)
    return attempts


# The columns a new attempt is inserted with; the others are NULL (finished_at).
_ATTEMPT_COLUMNS = ("status", "started_at", "heartbeat_at", "worker", "error", "outage")


@functools.lru_cache(maxsize=2)
def _next_attempt_statement(vendor: str) -> str:
    quote = connection.ops.quote_name
    meta = Attempt._meta
    columns = [meta.get_field(name).column for name in _ATTEMPT_COLUMNS]
    table, run_col, no_col = quote(meta.db_table), quote(meta.get_field("run").column), quote("attempt_no")
    return (f"INSERT INTO {table} ({run_col}, {no_col}, {', '.join(quote(c) for c in columns)}) "
            f"SELECT %s, COALESCE(MAX({no_col}), 0) + 1, {', '.join(['%s'] * len(columns))} "
            f"FROM {table} WHERE {run_col} = %s RETURNING {quote(meta.pk.column)}, {no_col}")


def _insert_next_attempt(run: Run, worker: str) -> Attempt:
    """Open the run's next attempt, numbered after its last one in the same statement.
    Only the transaction that claimed the run (queued -> running) gets here, so no
    other one numbers an attempt of this run meanwhile (and the unique constraint on
    (run, attempt_no) would refuse it)."""
    now = timezone.now()
    attempt = Attempt(run=run, status=A.RUNNING, started_at=now, heartbeat_at=now, worker=worker)
    meta = Attempt._meta
    values = [meta.get_field(name).get_db_prep_save(getattr(attempt, name), connection) for name in _ATTEMPT_COLUMNS]
    with connection.cursor() as cursor:
        cursor.execute(_next_attempt_statement(connection.vendor), [run.pk, *values, run.pk])
        attempt.pk, attempt.attempt_no = cursor.fetchone()
    attempt._state.adding = False
    attempt._state.db = connection.alias
    return attempt


# What verifies a run in the task that staged it: (run, fence) -> what happened.
InlineVerify = Callable[[Run, dict], str]


def run_execute(*, run_id: str, worker: str = "", verify: InlineVerify | None = None) -> str:
    """Execute the next attempt of a queued run. Returns what happened (for logs/tests).

    1. Claim the run (queued -> running) and open an attempt; a duplicate task finds
       it claimed and returns.
    2. Read the commit marker: committed => go on to verification without writing.
       Absent => stage again (staging discards the run's own partial rows, in its
       transaction, and refuses if another attempt committed meanwhile).
    3. Succeed the attempt and stage the run in one transaction; a fenced (lost)
       attempt cannot, so a stale worker never moves the run.
    4. With `verify` (the execute task's way), the same transaction also claims the
       run's verification (staged -> verifying, with its token), and `verify(run,
       fence)` checks and publishes it here, in this task, after the commit: no
       verify message, no second task, no second claim transaction. A process that
       dies after that commit leaves a `verifying` run that stops beating, which the
       sweeper hands back to `staged` and sends to verification
       (`runs_reclaim_verifying`), as for a verifier that died. Verification runs (a
       second rerun's) are compared by their own task, as before.
    """
    run = run_get(run_id)
    if run is None:
        return "missing"
    if run.status == S.STAGED:
        enqueue_verify(run)
        return "already-staged"
    if run.status != S.QUEUED:
        return f"skipped-{run.status}"
    if run.request_id and run.request.status not in (R.RUNNING,):
        return f"request-{run.request.status}"
    if run.retry_at and run.retry_at > timezone.now():
        # Delivered before its backoff ended (a re-send, a duplicate): not yet. The broker
        # holds the message it sends now until then.
        with transaction.atomic():
            enqueue_execute(run, at=run.retry_at)
        return "backing-off"
    if warehouse_outage_current() is not None:
        return "warehouse-unreachable"  # held; the probe that finds it back sends it again
    attempt = attempt_start(run, worker_name(worker))
    if attempt is None:
        return "claimed-elsewhere"
    with log_context(run_id=run.run_id, attempt_no=attempt.attempt_no, request_id=run.request_id):
        logger.info("attempt %s of %s %s started", attempt.attempt_no, run.job.name, run.partition_key)
        try:
            with Heartbeat(attempt, every=run.job.heartbeat_timeout_seconds / 4) as beat:
                marker = write_version(run, attempt, get_warehouse(), should_stop=beat.fenced.is_set)
        except Exception as exc:  # the attempt fails; the policy decides what next
            return attempt_failed(attempt=attempt, run=run, exc=exc)
        inline = verify is not None and run.run_type != RunType.VERIFICATION
        result = attempt_succeed(attempt=attempt, run=run, marker=marker, claim_verification=inline)
        if inline and result == "staged":
            return verify(run, {"verify_token": run.verify_token})
        return result


def worker_name(worker: str = "") -> str:
    """What an attempt records as its worker: the Celery node (or this host) and the process."""
    return f"{worker or socket.gethostname()}:{os.getpid()}"


def write_version(run: Run, attempt: Attempt, warehouse, *, should_stop: Callable[[], bool]):
    """The attempt's work: the run's version written with its commit marker, which it
    returns. Only an earlier attempt of this run can have committed its rows (the first
    attempt's staging reads the marker in its own transaction too): its marker is
    returned without writing again. Raises what the executor raised."""
    marker = warehouse.marker(run.run_id) if attempt.attempt_no > 1 else None
    if marker is not None:
        logger.info("commit marker found (attempt %s): not writing again", marker.attempt_no)
        return marker
    from backfill_portal.execution.executors import execute

    try:
        return execute(run, attempt.attempt_no, warehouse, should_stop=should_stop)
    except AlreadyCommitted as exc:
        # Another attempt of this run committed while we worked (we were stale, or
        # raced it): its rows are this run's rows; go on with its marker.
        logger.info("attempt %s of the same run committed first", exc.marker.attempt_no)
        return exc.marker


def attempt_failed(*, attempt: Attempt, run: Run, exc: Exception) -> str:
    """The attempt's work raised `exc`: end the attempt, and let the retry policy decide."""
    logger.warning("attempt failed: %s", exc)
    error = f"{type(exc).__name__}: {exc}"
    # Whether the warehouse itself refuses connections, asked of a fresh one: the
    # error's type cannot tell a dead server from a statement that failed.
    outage = warehouse_outage_confirm(error=error)
    return attempt_fail(attempt=attempt, run=run, error=error, outage=outage is not None)


def attempt_succeed(*, attempt: Attempt, run: Run, marker, claim_verification: bool = False) -> str:
    """`claim_verification`: the run goes on to `verifying` with its next token in this
    transaction (its verifier is this task), instead of a verify message."""
    try:
        with transaction.atomic(), audit_batch():
            attempt.run = run
            attempt_transition(attempt, to=A.SUCCEEDED, updates={"finished_at": timezone.now()})
            # One INSERT that a second delivery leaves as it is (one version per run),
            # with the baseline it is staged against (execution/anomalies.py).
            baseline, ratio = baseline_of(marker.row_count,
                                          trailing_row_counts(run.job.dataset_id, run.partition_key))
            Version.objects.bulk_create([Version(
                run=run, dataset=run.job.dataset, partition_key=run.partition_key, row_count=marker.row_count,
                fingerprint=marker.fingerprint, committed_attempt=marker.attempt_no,
                committed_at=marker.committed_at or timezone.now(), baseline_rows=baseline, row_ratio=ratio)],
                ignore_conflicts=True)
            run_transition(run, to=S.STAGED, data={"row_count": marker.row_count, "fingerprint": marker.fingerprint},
                           updates={"enqueued_at": timezone.now(), "output_columns": run.output_columns})
            if claim_verification:
                run_transition(run, to=S.VERIFYING, expect={"verify_token": run.verify_token},
                               updates={"verify_token": run.verify_token + 1, "verify_heartbeat_at": timezone.now()})
            else:
                enqueue_verify(run, stamped=True)
    except ConflictError:
        logger.warning("attempt %s was fenced (lost or cancelled); its result is refused", attempt.attempt_no)
        return "fenced"
    return "staged"


def attempts_succeed(staged: list[tuple[Run, Attempt, object]]) -> None:
    """`attempt_succeed(claim_verification=True)` for several attempts at once (a
    bundle's third step): the attempts succeeded, the versions recorded, the runs
    staged and their verification claimed, each edge one UPDATE for all, each run with
    the audit rows it gets alone. All or nothing, inside the caller's savepoint:
    ConflictError when any attempt was fenced (each then goes through
    `attempt_succeed` alone)."""
    now = timezone.now()
    runs = [run for run, _, _ in staged]
    markers = {run.pk: marker for run, _, marker in staged}
    for run, attempt, _ in staged:
        attempt.run = run
    attempts_transition([attempt for _, attempt, _ in staged], to=A.SUCCEEDED, updates={"finished_at": now})
    versions = []
    trailing = trailing_row_counts_of(runs[0].job.dataset_id, [run.partition_key for run in runs])
    for run, _, marker in staged:
        baseline, ratio = baseline_of(marker.row_count, trailing[run.partition_key])
        versions.append(Version(
            run=run, dataset=run.job.dataset, partition_key=run.partition_key, row_count=marker.row_count,
            fingerprint=marker.fingerprint, committed_attempt=marker.attempt_no,
            committed_at=marker.committed_at or now, baseline_rows=baseline, row_ratio=ratio))
    Version.objects.bulk_create(versions, ignore_conflicts=True)
    runs_transition(runs, to=S.STAGED, updates={"enqueued_at": now, "output_columns": lambda run: run.output_columns},
                    data=lambda run: {"row_count": markers[run.pk].row_count,
                                      "fingerprint": markers[run.pk].fingerprint})
    runs_transition(runs, to=S.VERIFYING, expect=lambda run: {"verify_token": run.verify_token},
                    updates={"verify_token": lambda run: run.verify_token + 1, "verify_heartbeat_at": now})


def retry_delay(failures: int) -> float:
    """Seconds to wait after the run's `failures`-th failed attempt: RETRY_BACKOFF_SECONDS
    doubled for each failure before it, capped at RETRY_BACKOFF_MAX_SECONDS, then a
    random half to all of it (runs that failed together do not retry together)."""
    ceiling = min(settings.RETRY_BACKOFF_MAX_SECONDS,
                  settings.RETRY_BACKOFF_SECONDS * 2 ** min(max(failures, 1) - 1, 32))
    return ceiling * random.uniform(0.5, 1.0)


def attempt_fail(*, attempt: Attempt, run: Run, error: str, to: str = A.FAILED, outage: bool = False) -> str:
    """End an attempt and apply the retry policy: a new attempt after a backoff until
    max_attempts, then the run (and its interval) fail and the queue moves on.

    `outage`: the warehouse refused connections (a fresh probe confirmed it). That is
    not the run's fault: the attempt does not count, and the run waits, queued, for the
    probe that finds the warehouse back (its message now is answered with
    "warehouse-unreachable" while the outage lasts)."""
    try:
        with transaction.atomic():
            attempt.run = run
            # One instant for the attempt's end and its retry's backoff, so the retry is
            # exactly the delay after the failure however long the statements between take.
            now = timezone.now()
            attempt_transition(attempt, to=to, reason=error[:500],
                               updates={"finished_at": now, "error": error[:4000], "outage": outage})
            run.refresh_from_db(fields=["status"])
            if run.status != S.RUNNING:
                return "fenced"
            if outage:
                run_transition(run, to=S.QUEUED, updates={"error": error[:4000]},
                               reason=f"attempt {attempt.attempt_no} {to}: the warehouse refuses connections; "
                                      "waiting for it (not counted as an attempt)")
                enqueue_execute(run)
                return "waiting-for-warehouse"
            failures = attempt.attempt_no - run.attempts.filter(outage=True).count()
            if failures < run.job.max_attempts:
                delay = retry_delay(failures)
                at = now + timedelta(seconds=delay) if delay > 0 else None
                run_transition(run, to=S.QUEUED, reason=f"attempt {attempt.attempt_no} {to}; retrying in {delay:.1f} s",
                               updates={"error": error[:4000], "retry_at": at, "enqueued_at": at or timezone.now()},
                               data={"retry_at": at.isoformat() if at else None})
                enqueue_execute(run, stamped=True, at=at)
                return "retrying"
            run_transition(run, to=S.FAILED, reason=f"failed after {attempt.attempt_no} attempt(s)",
                           updates={"error": error[:4000], "finished_at": timezone.now()})
            if run.run_type == RunType.VERIFICATION:
                _original_unproven(run)
            interval_fail_with_run(run)
            return "failed"
    except ConflictError:
        return "fenced"


def _original_unproven(verification: Run) -> None:
    """A second rerun that cannot complete proves nothing: its original must not wait
    in `verifying` (holding a slot) nor be published unproven."""
    original = verification_original(verification)
    if original is not None and original.status == S.VERIFYING:
        run_transition(original, to=S.VERIFICATION_FAILED,
                       reason=f"second rerun {verification.run_id} failed: {verification.error[:300]}",
                       updates={"error": "second rerun could not complete; not published unproven",
                                "finished_at": timezone.now()})


def attempts_sweep_lost(*, now=None) -> int:
    """Mark attempts whose heartbeat (or start) is older than the job's timeout as lost;
    the retry policy then starts the next attempt."""
    now = now or timezone.now()
    swept = 0
    running = Attempt.objects.filter(status=A.RUNNING).select_related("run__job__dataset", "run__interval", "run__request")
    for attempt in running:
        last = attempt.heartbeat_at or attempt.started_at
        if last >= now - timedelta(seconds=attempt.run.job.heartbeat_timeout_seconds):
            continue
        with log_context(run_id=attempt.run.run_id, attempt_no=attempt.attempt_no, request_id=attempt.run.request_id):
            logger.warning("heartbeat expired (last %s); attempt lost", last.isoformat())
            result = attempt_fail(attempt=attempt, run=attempt.run, to=A.LOST,
                                  error=f"heartbeat expired: last beat {last.isoformat()}")
        swept += result != "fenced"
    close_old_connections()
    return swept
