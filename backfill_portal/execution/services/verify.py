"""Verification of a staged version, then its publication by compare-and-set.

Checks (each blocking or warning, stored with their numbers) are the registered ones
of `execution/checks/`: row count above zero; row count within a band of the trailing
baseline; zero duplicate business keys; zero NULL business keys; declared schema; no
pinned input rolled back or built from a rolled-back one; core measure against the
source for the same interval; the catalog's custom SQL assertions (rows returned =
failure). A blocking failure leaves the old version visible.
"""
from __future__ import annotations

import logging
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from backfill_portal.backfills.choices import IntervalStatus as I
from backfill_portal.backfills.transitions import interval_transition, intervals_transition
from backfill_portal.core.errors import ConflictError
from backfill_portal.core.logging import log_context
from backfill_portal.core.retry import run_again_if_deadlocked
from backfill_portal.core.rows import insert_new_rows, insert_row
from backfill_portal.core.services.audit import audit_batch, audit_record
from backfill_portal.execution.checks import run_checks
from backfill_portal.execution.choices import RunStatus as S
from backfill_portal.execution.choices import RunType
from backfill_portal.execution.models import CheckResult, Run
from backfill_portal.execution.selectors import run_get, verification_original
from backfill_portal.execution.services.dispatch import (
    dispatch_request,
    dispatch_serialise,
    enqueue_execute,
    enqueue_verify,
)
from backfill_portal.execution.services.intervals import interval_fail_with_run
from backfill_portal.execution.services.runs import Heartbeat, run_execute
from backfill_portal.execution.transitions import run_transition, runs_transition
from backfill_portal.backends import PublishConflict, get_warehouse
from backfill_portal.catalog.specs import spec_for
from backfill_portal.warehouse.models import Consumption, Publication, Version
from backfill_portal.warehouse.services.outage import warehouse_outage_confirm

logger = logging.getLogger(__name__)


def run_verify(*, run_id: str) -> str:
    """staged -> verifying -> verified (then publish) or verification_failed.

    1. Claim the run with the next verification token and beat while checking; a
       verifier that dies after its claim stops beating, and the sweeper
       (`runs_reclaim_verifying`) hands the run back to `staged`.
    2. Every later transition expects that token: a verifier that was reclaimed
       (frozen, then woken) changes nothing and returns `fenced`.
    """
    run = run_get(run_id)
    if run is None:
        return "missing"
    if run.run_type == RunType.VERIFICATION:
        return second_rerun_compare(run_id=run_id)
    if run.status == S.VERIFIED:
        return _publish(run, actor=None)
    if run.status != S.STAGED:
        return f"skipped-{run.status}"
    with log_context(run_id=run.run_id, request_id=run.request_id):
        fence = verification_claim(run)
    if fence is None:
        return "claimed-elsewhere"
    return run_verify_claimed(run, fence)


def run_execute_and_verify(*, run_id: str, worker: str = "") -> str:
    """The execute task: the run's next attempt, then, once it is staged, its
    verification and publication in the same task (runs.run_execute, step 4)."""
    return run_execute(run_id=run_id, worker=worker, verify=run_verify_claimed)


def run_verify_claimed(run: Run, fence: dict) -> str:
    """Check a run this verifier has claimed (`fence`: its token), record the results
    and the verdict, then publish. Every transition expects the token."""
    warehouse = get_warehouse()
    with log_context(run_id=run.run_id, request_id=run.request_id):
        try:
            with verification_heartbeat(run, fence):
                checks = run_checks(run, warehouse)  # every registered check, in order
        except Exception as exc:
            result = verification_not_run(run, fence, exc)
            if result == "verification-error":
                raise
            return result
        result, current = verification_verdict(run, fence, checks, warehouse)
    if result != S.VERIFIED:
        return result
    # The run was just loaded and moved to verified here; the pointer just read.
    return _publish(run, actor=None, current=current)


def verification_not_run(run: Run, fence: dict, exc: Exception) -> str:
    """The checks could not run: the run goes back to `staged` (the stale-run sweeper
    sends it to verification again), or the warehouse is down and its probe resumes it.
    Returns "fenced", "warehouse-unreachable" or "verification-error"."""
    logger.warning("verification could not run: %s", exc)
    try:
        run_transition(run, to=S.STAGED, reason=f"verification could not run: {exc}", expect=fence,
                       updates={"verify_heartbeat_at": None})
    except ConflictError:
        return "fenced"
    if warehouse_outage_confirm(error=f"{type(exc).__name__}: {exc}") is not None:
        return "warehouse-unreachable"  # the probe that finds it back sends it again
    return "verification-error"


def verification_verdict(run: Run, fence: dict, checks: list, warehouse) -> tuple[str, str | None]:
    """Record the checks' results and the verdict in one transaction: `verified` (with
    the pointer read for its compare-and-set, returned beside it), `verification_failed`
    (the interval fails), or, for a request that verifies twice, the second rerun
    queued ("awaiting-second-rerun"). "fenced" when the verification was reclaimed."""
    blocking_failures = [c for c in checks if c.blocking and not c.passed]
    try:
        with transaction.atomic(), audit_batch():
            now = timezone.now()
            if fence["verify_token"] > 1:
                # An earlier verification of this run may have recorded results (the
                # first one of a run cannot have).
                CheckResult.objects.filter(run=run).delete()
            CheckResult.objects.bulk_create([
                CheckResult(run=run, name=c.name, blocking=c.blocking, passed=c.passed, observed=c.observed,
                            message=c.message, checked_at=now) for c in checks])
            summary = {c.name: c.passed for c in checks}
            if blocking_failures:
                reason = "; ".join(f"{c.name}: {c.message}" for c in blocking_failures)
                run_transition(run, to=S.VERIFICATION_FAILED, reason=reason[:500], data={"checks": summary},
                               updates={"error": reason[:4000], "finished_at": now}, expect=fence)
                interval_fail_with_run(run)
                logger.warning("verification failed: %s", reason)
                return "verification_failed", None
            if _needs_second_rerun(run):
                # It waits in `verifying` without a beat: the second rerun is the
                # live work now, with its own attempts and its own verification.
                if Run.objects.filter(pk=run.pk, status=S.VERIFYING, **fence).update(verify_heartbeat_at=None) != 1:
                    raise ConflictError(f"run {run.run_id}'s verification was reclaimed", field="status")
                second_rerun_start(run)
                return "awaiting-second-rerun", None
            current = warehouse.current(run.job.dataset.name, run.partition_key)
            run_transition(run, to=S.VERIFIED, data={"checks": summary}, expect=fence,
                           updates={"expected_previous_run_id": current or ""})
    except ConflictError:
        logger.warning("verification of %s was reclaimed meanwhile; its result is refused", run.run_id)
        return "fenced", None
    return S.VERIFIED, current


def verification_verdicts(checked: list[tuple[Run, dict, list]], warehouse) -> list[tuple[Run, str | None]]:
    """`verification_verdict` for several runs whose checks all passed and which
    publish without a second rerun (a bundle's fifth step): their results in one
    INSERT, the runs verified by one UPDATE, each with the audit row it gets alone;
    returns each run with the pointer read for its compare-and-set. All or nothing,
    inside the caller's savepoint: ConflictError when any verification was reclaimed;
    ValueError for a run that needs more than that (each then goes through
    `verification_verdict` alone)."""
    if any(c.blocking and not c.passed for _, _, checks in checked for c in checks) or any(
            _needs_second_rerun(run) for run, _, _ in checked):
        raise ValueError("a verdict other than verified: each run alone")
    now = timezone.now()
    again = [run.pk for run, fence, _ in checked if fence["verify_token"] > 1]
    if again:
        CheckResult.objects.filter(run_id__in=again).delete()  # an earlier verification's results
    results = [CheckResult(run=run, name=c.name, blocking=c.blocking, passed=c.passed, observed=c.observed,
                           message=c.message, checked_at=now) for run, _, checks in checked for c in checks]
    insert_new_rows(results)
    fences = {run.pk: fence for run, fence, _ in checked}
    summaries = {run.pk: {c.name: c.passed for c in checks} for run, _, checks in checked}
    runs = [run for run, _, _ in checked]
    pointers = warehouse.current_many(runs[0].job.dataset.name, [run.partition_key for run in runs])  # one job's
    current = {run.pk: pointers.get(run.partition_key) for run in runs}
    runs_transition(runs, to=S.VERIFIED, expect=lambda run: fences[run.pk],
                    data=lambda run: {"checks": summaries[run.pk]},
                    updates={"expected_previous_run_id": lambda run: current[run.pk] or ""})
    return [(run, current[run.pk]) for run in runs]


def verification_claim(run: Run) -> dict | None:
    """staged -> verifying with the next token; returns the fence every later
    transition of this verification expects, or None when another delivery won."""
    token = run.verify_token + 1
    try:
        run_transition(run, to=S.VERIFYING, expect={"verify_token": run.verify_token},
                       updates={"verify_token": token, "verify_heartbeat_at": timezone.now()})
    except ConflictError:
        return None
    return {"verify_token": token}


def verification_beat(*, run_pk: int, fence: dict) -> bool:
    """A conditional update: a reclaimed verification's beat changes nothing."""
    return Run.objects.filter(pk=run_pk, status=S.VERIFYING, **fence).update(verify_heartbeat_at=timezone.now()) == 1


def verification_heartbeat(run: Run, fence: dict) -> Heartbeat:
    pk = run.pk
    return Heartbeat(beat=lambda: verification_beat(run_pk=pk, fence=fence),
                     every=run.job.heartbeat_timeout_seconds / 4, name=f"verify-heartbeat-{pk}")


def runs_reclaim_verifying(*, now=None) -> int:
    """Hand back to `staged`, and verify again, every run whose verification stopped
    beating for longer than its job's heartbeat timeout: its verifier died after the
    claim (kill -9, a metadata database restart), and a redelivery of its task only
    finds it `verifying`. A verifier that was merely frozen is fenced by its token.
    Runs waiting for their second rerun have no beat and are left alone."""
    now = now or timezone.now()
    reclaimed = 0
    waiting = Run.objects.filter(status=S.VERIFYING, verify_heartbeat_at__isnull=False).select_related("job__dataset")
    for run in waiting:
        last = run.verify_heartbeat_at
        if last >= now - timedelta(seconds=run.job.heartbeat_timeout_seconds):
            continue
        with log_context(run_id=run.run_id, request_id=run.request_id):
            try:
                with transaction.atomic():
                    run_transition(run, to=S.STAGED, reason=f"verification lost: no heartbeat since {last.isoformat()}",
                                   expect={"verify_token": run.verify_token, "verify_heartbeat_at": last},
                                   updates={"verify_heartbeat_at": None})
                    enqueue_verify(run)
            except ConflictError:
                continue  # it beat, finished or was reclaimed meanwhile
            logger.warning("verification lost (last beat %s); verifying again", last.isoformat())
        reclaimed += 1
    return reclaimed


def run_publish(*, run_id: str, actor=None) -> str:
    """Switch the pointer by compare-and-set, then mirror it in the metadata.

    The warehouse switch is the truth and is idempotent from here: if the pointer
    already names this run (a crash between the two steps), only the mirror is done.
    """
    run = run_get(run_id)
    if run is None:
        return "skipped-missing"
    return _publish(run, actor=actor)


_UNREAD = object()


def _publish(run: Run, *, actor, current=_UNREAD) -> str:
    """`current`: the pointer as the caller last read it, if it did; the switch itself
    is a compare-and-set, so a pointer that moved since is a conflict, never an
    overwrite."""
    with log_context(run_id=run.run_id, request_id=run.request_id):
        refused = publish_switch(run, actor=actor, current=current)
        if refused:
            return refused
        # The pointer has switched: the metadata must follow. A deadlock with a person's
        # request-level operation (cancel, pause) aborts this transaction, not the switch:
        # run it again, on the run as it is now, rather than leave it to the sweeper.
        as_loaded = iter([run])

        def record() -> str:
            return publish_record(next(as_loaded, None) or run_get(run.run_id), actor=actor)

        return run_again_if_deadlocked(record, what=f"recording the publication of {run.run_id}")


def publish_switch(run: Run, *, actor, current=_UNREAD) -> str | None:
    """The warehouse's pointer switch (compare-and-set on the expected previous run):
    None once the pointer names the run (switched now, or already by an earlier try),
    else what happened instead ("conflict": the run fails, nothing overwritten)."""
    if run.status != S.VERIFIED:
        return f"skipped-{run.status}"
    if run.run_type == RunType.VERIFICATION:
        return "skipped-verification-run"  # computed only to be compared, never shown
    warehouse = get_warehouse()
    dataset = run.job.dataset
    expected = run.expected_previous_run_id or None
    if current is _UNREAD:
        current = warehouse.current(dataset.name, run.partition_key)
    if current == run.run_id:
        return None
    try:
        warehouse.publish(spec_or_name=spec_for(dataset), partition=run.partition_key, run_id=run.run_id,
                          expected_run_id=expected, actor=getattr(actor, "username", "system"))
    except PublishConflict as exc:
        with transaction.atomic():
            msg = (f"publish conflict: expected {expected or 'no version'} to be current, "
                   f"found {exc.current_run_id or 'none'}; nothing was overwritten")
            run_transition(run, to=S.FAILED, reason=msg, updates={"error": msg, "finished_at": timezone.now()})
            interval_fail_with_run(run)
        logger.warning(msg)
        return "conflict"
    return None


def publish_record(run: Run, *, actor, dispatch: bool = True) -> str:
    """Mirror a switched pointer in the metadata, in one transaction: the run published
    (its predecessor superseded), the Publication row, the interval published, and
    (`dispatch`) the freed slot filled by the request's next dispatch."""
    dataset = run.job.dataset
    expected = run.expected_previous_run_id or None
    with transaction.atomic(), audit_batch():
        if run.interval_id:
            # The next dispatch shares this transaction (below); its lock comes
            # before the audit chain's, in the order every dispatcher takes them.
            dispatch_serialise()
        version = Version.objects.get(run=run)
        previous_version = Version.objects.filter(run__run_id=expected).select_related("run").first() if expected else None
        if previous_version is not None:
            # The same dataset's version, so the same job's (a dataset has one job).
            previous_version.run.job = run.job
        if previous_version is not None and previous_version.run.status == S.PUBLISHED:
            run_transition(previous_version.run, to=S.SUPERSEDED, reason=f"superseded by {run.run_id}")
        run_transition(run, to=S.PUBLISHED, actor=actor, updates={"finished_at": timezone.now()},
                       data={"previous": expected, "row_count": version.row_count,
                             "fingerprint": version.fingerprint, "read": inputs_read([run.pk]).get(run.pk, [])})
        insert_row(Publication(dataset=dataset, partition_key=run.partition_key, version=version,
                               previous_version=previous_version, action=Publication.Action.PUBLISH,
                               actor=actor, request=run.request, published_at=timezone.now()))
        if run.interval_id:
            run.interval.request = run.request
            interval_transition(run.interval, to=I.PUBLISHED, data={"run_id": run.run_id}, dataset=dataset.name)
            if dispatch:
                dispatch_after_publication(run.request_id)
    logger.info("published %s/%s (previous %s)", dataset.name, run.partition_key, expected)
    return "published"


def inputs_read(run_pks: list[int]) -> dict[int, list[str]]:
    """{run pk: the inputs it read pinned, "dataset/partition@run_id" for a version and
    "dataset/partition@rows=N,max=T" for a source's watermark}: what a publication's
    audit row carries, so the chained log itself says what the published numbers were
    built from (the consumption rows alone could be edited unnoticed)."""
    out: dict[int, list[str]] = {}
    for run_pk, dataset, partition, run_id, watermark in (
            Consumption.objects.filter(run_id__in=run_pks).order_by("run_id", "dataset__name", "partition_key")
            .values_list("run_id", "dataset__name", "partition_key", "version__run__run_id", "watermark")):
        pinned = run_id or ",".join(f"{k}={v}" for k, v in sorted((watermark or {}).items()))
        out.setdefault(run_pk, []).append(f"{dataset}/{partition}@{pinned}")
    return out


def publish_records(runs: list[Run]) -> None:
    """`publish_record` (by the system, without its dispatch) for several runs of one
    request's job whose pointers were switched (a bundle's sixth step): the runs
    published and their predecessors superseded, one UPDATE per edge; their
    Publication rows in one INSERT; their intervals published by one UPDATE; each with
    the audit rows it gets alone. All or nothing, inside the caller's savepoint:
    ConflictError when any row moved on (each then goes through `publish_record` alone)."""
    now = timezone.now()
    dispatch_serialise()  # before the audit chain's lock, as publish_record takes them
    versions = {version.run_id: version for version in Version.objects.filter(run__in=runs)}
    expected = {run.pk: run.expected_previous_run_id or None for run in runs}
    previous = {version.run.run_id: version for version in Version.objects.filter(
        run__run_id__in=[e for e in expected.values() if e]).select_related("run")}
    successor = {}
    for run in runs:
        version = previous.get(expected[run.pk])
        if version is not None:
            version.run.job = run.job  # the same dataset's version, so the same job's
            successor[version.run.pk] = run
    runs_transition([version.run for version in previous.values() if version.run.status == S.PUBLISHED],
                    to=S.SUPERSEDED, reason=lambda old: f"superseded by {successor[old.pk].run_id}")
    read = inputs_read([run.pk for run in runs])
    runs_transition(runs, to=S.PUBLISHED, updates={"finished_at": now},
                    data=lambda run: {"previous": expected[run.pk], "row_count": versions[run.pk].row_count,
                                      "fingerprint": versions[run.pk].fingerprint, "read": read.get(run.pk, [])})
    insert_new_rows([
        Publication(dataset=run.job.dataset, partition_key=run.partition_key, version=versions[run.pk],
                    previous_version=previous.get(expected[run.pk]), action=Publication.Action.PUBLISH,
                    actor=None, request=run.request, published_at=now) for run in runs])
    run_of = {run.interval_id: run for run in runs if run.interval_id}
    for run in run_of.values():
        run.interval.request = run.request
    intervals_transition([run.interval for run in run_of.values()], to=I.PUBLISHED,
                         data=lambda interval: {"run_id": run_of[interval.pk].run_id},
                         dataset=lambda interval: run_of[interval.pk].job.dataset.name)


def dispatch_after_publication(request_id: int) -> None:
    """A published interval frees a slot: fill it now, in the publication's own
    transaction (the dispatch lock and the audit chain's are already held), rather
    than through another task or another transaction. The dispatch is a savepoint: if
    it fails, the publication still commits, and the sweeper's periodic dispatch of
    every running request fills the slot (as it does if the process dies after the
    commit, before the runs' messages are sent: the outbox sends them)."""
    try:
        dispatch_request(request_id=request_id, in_publication=True)
    except Exception:
        logger.exception("dispatch after publication failed; the sweeper will dispatch request %s", request_id)


# -- second-rerun verification (requests with verify_twice) ----------------------------------
#
# A small state machine driven by the ordinary tasks:
#   original: staged -> verifying (checks pass) ... waits in `verifying`
#   verification run: created queued, with the original's pinned inputs copied, executed
#   by execute_run into its own isolated version, staged, then verify_run compares it:
#     same fingerprint and numbers -> original verified -> published;
#                                      the verification run is retired (never published)
#     different                    -> both verification_failed ("non-deterministic"), the
#                                      interval fails, nothing becomes visible.
# The original waits in `verifying` rather than `verified` so that no path (the sweeper
# re-sending verified runs, a duplicate task) can publish it before the comparison.


def _needs_second_rerun(run: Run) -> bool:
    return bool(run.run_type == RunType.BACKFILL and run.request_id and run.interval_id and run.request.verify_twice)


def second_rerun_start(run: Run) -> Run:
    """Create the verification run of `run` (inside the caller's transaction): same job,
    interval and code version, the same pinned inputs (its Consumption rows are copied
    before it executes, and pin_inputs reuses existing rows), then queue it."""
    existing = Run.objects.filter(interval_id=run.interval_id, run_type=RunType.VERIFICATION, pk__gt=run.pk).first()
    if existing is not None:
        return existing
    verification = Run.objects.create(
        job=run.job, run_type=RunType.VERIFICATION, request=run.request, interval=run.interval,
        partition_key=run.partition_key, data_interval_start=run.data_interval_start,
        data_interval_end=run.data_interval_end, code_version_id=run.code_version_id,
    )
    Consumption.objects.bulk_create([
        Consumption(run=verification, dataset_id=c.dataset_id, partition_key=c.partition_key, version_id=c.version_id,
                    watermark=c.watermark, pinned_at=c.pinned_at)
        for c in Consumption.objects.filter(run=run)
    ])
    audit_record(actor=None, action="run.created", object_type="run", object_id=verification.pk,
                 request_id=run.request_id, dataset=run.job.dataset.name, to_state=S.QUEUED,
                 reason=f"second-rerun verification of {run.run_id}",
                 data={"run_id": verification.run_id, "partition": run.partition_key, "run_type": RunType.VERIFICATION,
                       "verifies": run.run_id, "code_version": run.code_version_id,
                       "code_hash": run.code_version.hash if run.code_version_id else None})
    enqueue_execute(verification)
    logger.info("checks passed; second rerun %s queued before publishing", verification.run_id)
    return verification


def _numbers(profile) -> dict:
    return {"fingerprint": profile.fingerprint, "rows": profile.row_count, "distinct_keys": profile.distinct_keys,
            "null_keys": profile.null_keys, "measure": profile.measure_sum}


def second_rerun_compare(*, run_id: str) -> str:
    """Compare a staged verification run with its original; publish the original only
    when the fingerprint and the four numbers are the same."""
    verification = run_get(run_id)
    if verification is None:
        return "missing"
    if verification.status != S.STAGED:
        return f"skipped-{verification.status}"
    with log_context(run_id=verification.run_id, request_id=verification.request_id):
        fence = verification_claim(verification)
        if fence is None:
            return "claimed-elsewhere"
        original = verification_original(verification)
        if original is None or original.status != S.VERIFYING:
            state = original.status if original else "missing"
            try:
                run_transition(verification, to=S.CANCELLED, reason=f"its original run is {state}; nothing to compare",
                               updates={"finished_at": timezone.now()}, expect=fence)
            except ConflictError:
                return "fenced"
            return "orphan"
        warehouse = get_warehouse()
        spec = spec_for(original.job.dataset)
        try:
            with verification_heartbeat(verification, fence):
                first = _numbers(warehouse.profile(spec=spec, run_id=original.run_id))
                second = _numbers(warehouse.profile(spec=spec, run_id=verification.run_id))
        except Exception as exc:
            logger.warning("second-rerun comparison could not run: %s", exc)
            try:
                run_transition(verification, to=S.STAGED, reason=f"comparison could not run: {exc}", expect=fence,
                               updates={"verify_heartbeat_at": None})
            except ConflictError:
                return "fenced"
            raise
        differs = sorted(k for k in first if first[k] != second[k])
        observed = {"original_run_id": original.run_id, "verification_run_id": verification.run_id,
                    "original": first, "second": second, "differs": differs}
        now = timezone.now()
        try:
            with transaction.atomic():
                message = "" if not differs else (
                    "non-deterministic: the same code on the same pinned inputs gave a different result ("
                    + ", ".join(f"{k} {first[k]} vs {second[k]}" for k in differs) + ")")
                for target in (original, verification):
                    CheckResult.objects.create(run=target, name="second_rerun", blocking=True, passed=not differs,
                                               observed=observed, message=message, checked_at=now)
                if differs:
                    run_transition(verification, to=S.VERIFICATION_FAILED, reason=message[:500],
                                   updates={"error": message[:4000], "finished_at": now},
                                   data={"verifies": original.run_id}, expect=fence)
                    run_transition(original, to=S.VERIFICATION_FAILED, reason=message[:500],
                                   updates={"error": message[:4000], "finished_at": now},
                                   data={"checks": {"second_rerun": False}, "verification_run_id": verification.run_id})
                    interval_fail_with_run(original)
                    logger.warning("%s", message)
                    return "non_deterministic"
                # Retired, not published: a verification run only ever proves the original.
                run_transition(verification, to=S.CANCELLED, updates={"finished_at": now}, expect=fence,
                               reason=f"second rerun matched {original.run_id}; verification runs are never published",
                               data={"verifies": original.run_id, "fingerprint": second["fingerprint"]})
                expected = warehouse.current(original.job.dataset.name, original.partition_key) or ""
                run_transition(original, to=S.VERIFIED, updates={"expected_previous_run_id": expected},
                               data={"checks": {"second_rerun": True}, "verification_run_id": verification.run_id})
        except ConflictError:
            logger.warning("comparison of %s was reclaimed meanwhile; its result is refused", verification.run_id)
            return "fenced"
    return run_publish(run_id=original.run_id)
