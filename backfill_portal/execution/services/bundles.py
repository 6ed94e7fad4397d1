"""A bundle: several queued runs of one request's cheap job, run by one task.

A backfill of cheap intervals (an hour of page views, a few milliseconds of warehouse
work each) spends most of its time on bookkeeping that is the same for every run: a
task to deliver, a run to load, a transaction to commit and an audit batch to sign at
each step, a dispatch after every publication. Dispatch sends such runs as bundles
(`dispatch.bundle_size`), and this module runs a bundle step by step, each step one
transaction for every run in it:

1. claim the runs and open their attempts;
2. write each run's version (one heartbeat beats every attempt of the bundle);
3. succeed the attempts, record the versions and claim the verifications;
4. run each run's checks (one verification heartbeat);
5. record every verdict;
6. switch each verified run's pointer in the warehouse (compare-and-set, one by one),
   then record the publications and dispatch the request once.

Each run keeps everything a run alone has: its own attempt, version, consumption,
check results, publication, audit rows and lineage events. A step takes all its runs
with one statement per edge (`_all_or_each`); when one of them goes another way, the
step's transaction rolls back and its runs are taken one by one, each inside a
savepoint of the step's transaction, so one run's lost race or failure changes
nothing of the others'. What goes wrong for one run goes the way it goes for a run
alone: a failed attempt retries on its own (`attempt_fail`), a run whose verification
could not run goes back to `staged`, a publish conflict fails the run. A worker that
dies mid-bundle leaves attempts that stop beating (or verifications that stop beating):
the sweeper retries each run alone, as for any lost attempt. A duplicate delivery of
the bundle finds its runs claimed and does nothing.
"""
from __future__ import annotations

import logging

from django.db import transaction
from django.db.models import Q, prefetch_related_objects
from django.utils import timezone

from backfill_portal.backfills.choices import RequestStatus as R
from backfill_portal.core.logging import log_context, run_log_context
from backfill_portal.core.services.audit import audit_batch
from backfill_portal.execution.checks import run_checks
from backfill_portal.execution.choices import AttemptStatus as A
from backfill_portal.execution.choices import RunStatus as S
from backfill_portal.execution.choices import RunType
from backfill_portal.execution.models import Attempt, Run
from backfill_portal.execution.services.runs import (
    Heartbeat,
    attempt_failed,
    attempt_start,
    attempt_succeed,
    attempts_start,
    attempts_succeed,
    worker_name,
    write_version,
)
from backfill_portal.execution.services.verify import (
    dispatch_after_publication,
    publish_record,
    publish_records,
    publish_switch,
    run_execute_and_verify,
    verification_not_run,
    verification_verdict,
    verification_verdicts,
)
from backfill_portal.backends import get_warehouse
from backfill_portal.warehouse.services.outage import warehouse_outage_current

logger = logging.getLogger(__name__)


def runs_execute_bundle(*, run_ids: list[str], worker: str = "") -> dict[str, str]:
    """Run a bundle (module docstring); returns what happened to each run, by run id.
    A run that is not simply queued (staged already, backing off, claimed) goes the
    way the execute task would take it alone."""
    results: dict[str, str] = {}
    loaded = {run.run_id: run for run in Run.objects.select_related(
        "job__dataset", "code_version", "request", "interval").filter(run_id__in=run_ids).order_by()}
    jobs: dict[int, object] = {}
    for run in loaded.values():
        # One job object for the bundle's runs (one job): what a run reads of it once per
        # object (its upstreams) is read once per bundle.
        run.job = jobs.setdefault(run.job_id, run.job)
    runs: list[Run] = []
    for run_id in run_ids:
        run = loaded.get(run_id)
        if run is None:
            results[run_id] = "missing"
        elif (run.status == S.QUEUED and run.retry_at is None and run.run_type == RunType.BACKFILL
              and run.request is not None and run.request.status == R.RUNNING):
            runs.append(run)
        else:
            with run_log_context(run_id=run_id):
                results[run_id] = run_execute_and_verify(run_id=run_id, worker=worker)
    if not runs:
        return results
    if warehouse_outage_current() is not None:
        # Held, as a run alone is: the probe that finds the warehouse back sends each again.
        return results | dict.fromkeys((run.run_id for run in runs), "warehouse-unreachable")
    with log_context(request_id=runs[0].request_id):
        staged = _claim_and_stage(runs, worker_name(worker), results)
        verified = _verify(staged, results)
        _publish(verified, results)
    return results


def _claim_and_stage(runs: list[Run], worker: str, results: dict[str, str]) -> list[tuple[Run, dict]]:
    """Steps 1-3: the runs whose versions are staged and whose verification this
    bundle has claimed, each with its fence."""
    def each():
        started = []
        for run in runs:
            attempt = attempt_start(run, worker)
            if attempt is None:
                results[run.run_id] = "claimed-elsewhere"
            else:
                started.append((run, attempt))
        return started

    started = _all_or_each(lambda: list(zip(runs, attempts_start(runs, worker))), each, rows=_rows(runs))
    if not started:
        return []
    warehouse = get_warehouse()
    markers = []
    with _AttemptsHeartbeat([attempt for _, attempt in started], runs[0].job.heartbeat_timeout_seconds / 4) as beat:
        for run, attempt in started:
            with run_log_context(run_id=run.run_id, attempt_no=attempt.attempt_no):
                logger.info("attempt %s of %s %s started (bundle)", attempt.attempt_no, run.job.name,
                            run.partition_key)
                try:
                    marker = write_version(run, attempt, warehouse, should_stop=beat.stopped(attempt))
                except Exception as exc:  # this attempt fails; the others go on
                    results[run.run_id] = attempt_failed(attempt=attempt, run=run, exc=exc)
                    continue
            markers.append((run, attempt, marker))
    def each():
        staged = []
        for run, attempt, marker in markers:
            with run_log_context(run_id=run.run_id, attempt_no=attempt.attempt_no):
                result = attempt_succeed(attempt=attempt, run=run, marker=marker, claim_verification=True)
            if result == "staged":
                staged.append(run)
            else:
                results[run.run_id] = result
        return staged

    staged = _all_or_each(lambda: attempts_succeed(markers) or [run for run, _, _ in markers], each,
                          rows=_rows([run for run, _, _ in markers]) + [attempt for _, attempt, _ in markers])
    return [(run, {"verify_token": run.verify_token}) for run in staged]


def _verify(staged: list[tuple[Run, dict]], results: dict[str, str]) -> list[tuple[Run, str | None]]:
    """Steps 4-5: the verified runs, each with the pointer its verdict read."""
    if not staged:
        return []
    warehouse = get_warehouse()
    prefetch_related_objects([run for run, _ in staged], "version")  # what the row-count check reads
    checked = []
    with _VerificationsHeartbeat(staged, staged[0][0].job.heartbeat_timeout_seconds / 4):
        for run, fence in staged:
            with run_log_context(run_id=run.run_id):
                try:
                    checked.append((run, fence, run_checks(run, warehouse)))
                except Exception as exc:
                    results[run.run_id] = verification_not_run(run, fence, exc)
    def each():
        verified = []
        for run, fence, checks in checked:
            with run_log_context(run_id=run.run_id):
                result, current = verification_verdict(run, fence, checks, warehouse)
            if result == S.VERIFIED:
                verified.append((run, current))
            else:
                results[run.run_id] = result
        return verified

    return _all_or_each(lambda: verification_verdicts(checked, warehouse), each,
                        rows=_rows([run for run, _, _ in checked]))


def _publish(verified: list[tuple[Run, str | None]], results: dict[str, str]) -> None:
    """Step 6. A run whose switch went through but whose record failed stays `verified`
    with the pointer naming it: the stale-run sweeper sends it to verification again,
    which finds the pointer switched and records it (as for a run alone)."""
    switched = []
    for run, current in verified:
        with run_log_context(run_id=run.run_id):
            try:
                refused = publish_switch(run, actor=None, current=current)
            except Exception:  # the warehouse failed it: the run stays verified, and is sent again
                logger.exception("the pointer switch of %s failed; the sweeper will send it again", run.run_id)
                refused = "switch-failed"
        if refused:
            results[run.run_id] = refused
        else:
            switched.append(run)
    if not switched:
        return
    def each():
        for run in switched:
            with run_log_context(run_id=run.run_id):
                try:
                    results[run.run_id] = publish_record(run, actor=None, dispatch=False)
                except Exception:
                    logger.exception("publication of %s could not be recorded; the sweeper will", run.run_id)
                    results[run.run_id] = "unrecorded"

    def all_():
        publish_records(switched)
        for run in switched:
            with run_log_context(run_id=run.run_id):
                logger.info("published %s/%s (previous %s)", run.job.dataset.name, run.partition_key,
                            run.expected_previous_run_id or None)
            results[run.run_id] = "published"

    def then(_):
        if any(results[run.run_id] == "published" for run in switched):
            dispatch_after_publication(switched[0].request_id)  # the slots the bundle freed, filled at once

    _all_or_each(all_, each, rows=_rows(switched), then=then)


def _all_or_each(together, each, *, rows: list, then=lambda result: None):
    """A step for the whole bundle at once, in a transaction of its own with its audit
    rows (`together`: one statement per edge), or, when any run does not simply go the
    common way (a run claimed elsewhere, an attempt fenced, a check failed, anything
    raised), that transaction rolled back, the `rows` it had changed in memory put back
    as they were, and `each` run taken alone in another, with a savepoint of its own.
    `then(result)`: what else the step's transaction holds, either way (no savepoint
    around the common way: the transaction is the step's alone, so rolling it back
    loses nothing else)."""
    saved = [(row, {f.attname: getattr(row, f.attname) for f in row._meta.concrete_fields}) for row in rows]
    try:
        with transaction.atomic(), audit_batch():
            result = together()
            then(result)
            return result
    except Exception as exc:
        for row, values in saved:
            for name, value in values.items():
                setattr(row, name, value)
        logger.info("bundle step taken run by run: %s", exc)
    with transaction.atomic(), audit_batch():
        result = each()
        then(result)
        return result


def _rows(runs: list[Run]) -> list:
    """The runs and their intervals: what a step changes in memory."""
    return list(runs) + [run.interval for run in runs if run.interval_id]


class _AttemptsHeartbeat(Heartbeat):
    """One heartbeat for every attempt of a bundle: one conditional update a beat. An
    attempt that stops running (marked lost, its request cancelled) drops out and is
    fenced (`stopped(attempt)` turns true); the others beat on."""

    def __init__(self, attempts: list[Attempt], every: float):
        # Replaced whole by the heartbeat's thread, read by the bundle's: no lock needed.
        self._alive = frozenset(attempt.pk for attempt in attempts)
        super().__init__(beat=self._beat, every=every, name="bundle-heartbeat")

    def _beat(self) -> bool:
        alive = self._alive
        if Attempt.objects.filter(pk__in=alive, status=A.RUNNING).update(heartbeat_at=timezone.now()) != len(alive):
            self._alive = alive = frozenset(
                Attempt.objects.filter(pk__in=alive, status=A.RUNNING).values_list("pk", flat=True))
        return bool(alive)

    def stopped(self, attempt: Attempt):
        return lambda: attempt.pk not in self._alive


class _VerificationsHeartbeat(Heartbeat):
    """One verification heartbeat for every run of a bundle, each under its fence."""

    def __init__(self, staged: list[tuple[Run, dict]], every: float):
        self._fenced = Q()
        for run, fence in staged:
            self._fenced |= Q(pk=run.pk, **fence)
        self._count = len(staged)
        super().__init__(beat=self._beat, every=every, name="bundle-verify-heartbeat")

    def _beat(self) -> bool:
        beaten = Run.objects.filter(self._fenced, status=S.VERIFYING).update(verify_heartbeat_at=timezone.now())
        return beaten > 0
