"""Dispatch: turn a running request's planned intervals into queued runs, within the
three gates (request max active intervals; job and team max concurrent runs; the
data-source pool's slots, some reserved for production)."""
from __future__ import annotations

import logging
import statistics
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Q
from django.utils import timezone

from backfill_portal.backfills.choices import IntervalStatus as I
from backfill_portal.backfills.choices import RequestStatus as R
from backfill_portal.backfills.choices import Cascade, Strategy
from backfill_portal.backfills.models import BackfillRequest, Interval
from backfill_portal.backfills.policy import require_operate
from backfill_portal.backfills.selectors import request_get
from backfill_portal.backfills.services.lifecycle import request_fail, request_reconciling, request_resume_after_failure
from backfill_portal.backfills.services.requests import request_lock
from backfill_portal.backfills.transitions import interval_transition, intervals_bulk_transition, intervals_transition
from backfill_portal.catalog.models import CodeVersion, Job
from backfill_portal.core.errors import ConflictError, NotFound
from backfill_portal.core.locks import shared_lock
from backfill_portal.core.retry import run_again_if_deadlocked
from backfill_portal.core.services.audit import audit_batch, audit_record, audit_serialise
from backfill_portal.execution.choices import AttemptStatus, RunStatus, RunType
from backfill_portal.execution.models import Attempt, Run
from backfill_portal.execution.queue import BACKFILL_QUEUE, PRODUCTION_QUEUE, broker_queue_depth, enqueue
from backfill_portal.execution.transitions import RUN_ACTIVE, attempt_transition, run_transition
from backfill_portal.warehouse.services.outage import warehouse_outage_current, warehouse_outage_probe

logger = logging.getLogger(__name__)
_DISPATCH_LOCK_KEY = 7_351_002


def run_headers(run: Run) -> dict:
    return {"run_id": run.run_id, "request_id": run.request_id, "job": run.job.name, "partition": run.partition_key}


def run_queue(run: Run) -> str:
    return PRODUCTION_QUEUE if run.run_type == RunType.SCHEDULED else BACKFILL_QUEUE


def enqueue_execute(run: Run, *, stamped: bool = False, at=None) -> None:
    """Queue the run's next attempt. `enqueued_at` (what the stale-run sweeper reads)
    is set here unless the caller's own write already set it (`stamped`). `at`: not
    before this time (a retry's backoff); the broker holds the message until then, and
    `enqueued_at` is that time, so the stale-run sweeper counts from when it is due."""
    _enqueue_run_task("execution.execute_run", run, stamped, at)


def enqueue_verify(run: Run, *, stamped: bool = False) -> None:
    _enqueue_run_task("execution.verify_run", run, stamped)


def _enqueue_run_task(task: str, run: Run, stamped: bool, at=None) -> None:
    if not stamped:
        Run.objects.filter(pk=run.pk).update(enqueued_at=at or timezone.now())
    enqueue(task, run.run_id, headers=run_headers(run), queue=run_queue(run), eta=at)


RUN_WAITING = (RunStatus.QUEUED, RunStatus.STAGED, RunStatus.VERIFIED)


def runs_resend_stale(*, older_than_seconds: int = 600, now=None) -> int:
    """Re-send the next task of runs whose message a broker lost (a Redis restarted
    without its data). Duplicates are harmless: tasks claim before working.

    1. The waiting runs (queued, staged, verified), by the queue their task goes to.
    2. A queue that holds fewer messages than runs wait on it has lost some: each of
       its runs sent longer ago than its job's heartbeat timeout is sent again, so a
       lost message costs about a heartbeat timeout, not ten minutes. A full queue
       (a backlog) is left alone, and so is a run sent recently.
    3. Where the broker cannot say how many it holds, a run waiting longer than
       `older_than_seconds` is sent again.
    Each send stamps `enqueued_at`: a run goes again at most once a heartbeat timeout."""
    now = now or timezone.now()
    waiting: dict[str, list[Run]] = {}
    for run in Run.objects.filter(status__in=RUN_WAITING).select_related("job").order_by("enqueued_at")[:2000]:
        waiting.setdefault(run_queue(run), []).append(run)
    count = 0
    for queue, runs in waiting.items():
        depth = broker_queue_depth(queue)
        lost = depth is not None and depth < len(runs)
        for run in runs:
            sent = run.enqueued_at or run.created_at
            timeout = run.job.heartbeat_timeout_seconds if lost else older_than_seconds
            if sent >= now - timedelta(seconds=timeout):
                continue
            with transaction.atomic():
                if run.status == RunStatus.QUEUED:
                    enqueue_execute(run)
                else:
                    enqueue_verify(run)
            count += 1
    if count:
        logger.warning("re-sent the task of %s run(s) a broker lost", count)
    return count


def dispatch_serialise() -> None:
    # PostgreSQL needs a lock so two dispatchers cannot both count free slots and both
    # take the last one (SQLite's IMMEDIATE transactions already serialise writers).
    shared_lock(_DISPATCH_LOCK_KEY)


def free_slots(job: Job, *, production: bool) -> int:
    """What the job, its team and its pool still allow (not counting the request gate)."""
    team, pool = job.dataset.team, job.pool
    # One scan of the active runs counts all three.
    active = Run.objects.filter(status__in=RUN_ACTIVE).aggregate(
        of_job=Count("pk", filter=Q(job=job)),
        of_team=Count("pk", filter=Q(job__dataset__team=team)),
        of_pool=Count("pk", filter=Q(job__pool=pool)),
    )
    pool_limit = pool.slots if production else pool.slots - pool.reserved_for_production
    return max(0, min(job.max_concurrent_runs - active["of_job"], team.max_concurrent_runs - active["of_team"],
                      pool_limit - active["of_pool"]))




def _candidates(request: BackfillRequest, job: Job, limit: int) -> list[Interval]:
    base = Interval.objects.filter(request=request, job=job)
    if job.depends_on_past:
        # Strictly in order: the next interval only once every earlier one is published.
        if base.filter(status__in=[I.QUEUED, I.RUNNING, I.FAILED]).exists():
            return []
        nxt = base.filter(status=I.PLANNED).order_by("position").first()
        return [nxt] if nxt else []
    order = "-position" if request.strategy == Strategy.BACKWARD else "position"
    return list(base.filter(status=I.PLANNED).order_by(order)[:limit])


def _request_graph(request: BackfillRequest) -> tuple[list[tuple], dict[int, Job], dict[int, list[int]]]:
    """The request's intervals as (pk, job_id, position, start, end, status) rows, its
    jobs, and for each job the jobs of this request whose datasets it reads."""
    rows = list(Interval.objects.filter(request=request).values_list("pk", "job_id", "position", "start", "end", "status"))
    ids = {row[1] for row in rows}
    jobs = {j.pk: j for j in Job.objects.filter(pk__in=ids).select_related("dataset__team", "pool")
            .prefetch_related("upstreams__job")}
    producers = {pk: [up.job.pk for up in job.upstreams.all() if hasattr(up, "job") and up.job.pk in ids]
                 for pk, job in jobs.items()}
    return rows, jobs, producers


def _cascade_candidates(request: BackfillRequest, budget: int) -> list[Interval]:
    """Intervals of a multi-job request that may start now: every interval of an
    upstream job of this request that it reads must be published by this request
    (version events, not green tasks). Layer order follows from that rule."""
    rows, jobs, producers = _request_graph(request)
    by_job: dict[int, list[tuple]] = {}
    for row in rows:
        by_job.setdefault(row[1], []).append(row)
    chosen: list[int] = []
    order = sorted(jobs.values(), key=lambda j: (j.pk != request.job_id, len(producers[j.pk]), j.name))
    for job in order:
        if len(chosen) >= budget:
            break
        # A depends_on_past job goes oldest first whatever the strategy: each reads the one before.
        own = sorted(by_job[job.pk], key=lambda r: r[2],
                     reverse=request.strategy == Strategy.BACKWARD and not job.depends_on_past)
        if job.depends_on_past and any(r[5] in (I.QUEUED, I.RUNNING, I.FAILED) for r in own):
            continue
        job_budget = min(budget - len(chosen), free_slots(job, production=False))
        for pk, _job, _pos, start, end, status in own:
            if job_budget <= 0:
                break
            if status != I.PLANNED:
                continue
            ready = all(
                r[5] in (I.PUBLISHED, I.SKIPPED)
                for up in producers[job.pk] for r in by_job[up] if r[3] < end and r[4] > start
            )
            if ready:
                chosen.append(pk)
                job_budget -= 1
            if job.depends_on_past:
                break  # strictly in order: only the oldest planned interval may go
    found = {i.pk: i for i in Interval.objects.filter(pk__in=chosen).select_related("job__dataset")}
    return [found[pk] for pk in chosen]


def _skip_reason(request: BackfillRequest, job: Job, authorised: set[int]) -> str:
    if job.has_side_effects and job.pk not in authorised:
        return "side-effect node not authorised by this request"
    if (request.node_actions or {}).get(job.name) == "skip":
        return "skipped by the requester"
    return ""


def _request_jobs(request: BackfillRequest) -> dict[int, Job]:
    """The jobs the request's intervals belong to: its own job alone unless it cascades
    (a hand-off's downstream work is a linked request of its own)."""
    if request.cascade == Cascade.NONE:
        return {request.job_id: request.job}
    return {j.pk: j for j in Job.objects.filter(
        pk__in=Interval.objects.filter(request=request).values("job_id")).select_related("dataset__team", "pool")}


def dispatch_request(*, request_id: int, in_publication: bool = False) -> int:
    """Claim eligible intervals and queue their runs. Safe to call at any time, twice.

    `in_publication`: called inside a publication's transaction, which holds the
    dispatch lock already (`dispatch_serialise`) and has just had its answer from the
    warehouse, so neither the lock nor the outage is asked again. (An outage another
    worker records meanwhile holds the new runs at their start, as it holds any.)"""
    created = 0
    with transaction.atomic(), audit_batch():
        if not in_publication:
            dispatch_serialise()
        # What dispatch reads of the request: its job, the job's team and pool (the gates);
        # not the requester, owner and code version request_get also joins for pages.
        try:
            request = BackfillRequest.objects.select_related("job__dataset__team", "job__pool").get(pk=request_id)
        except BackfillRequest.DoesNotExist:
            raise NotFound(f"backfill request {request_id} does not exist") from None
        if request.status != R.RUNNING or request.paused:
            return 0
        if not in_publication and warehouse_outage_current() is not None:
            return 0  # nothing starts while the warehouse refuses; its probe dispatches again
        jobs = _request_jobs(request)
        authorised = (set(request.side_effects.values_list("pk", flat=True))
                      if any(j.has_side_effects for j in jobs.values()) else set())
        for job in jobs.values():
            reason = _skip_reason(request, job, authorised)
            if reason:
                for interval in Interval.objects.filter(request=request, job=job, status=I.PLANNED):
                    interval.request = request
                    interval_transition(interval, to=I.SKIPPED, reason=reason, dataset=job.dataset.name)
        in_flight = Interval.objects.filter(request=request, status__in=[I.QUEUED, I.RUNNING]).count()
        budget = request.max_active_intervals - in_flight
        sizes: dict[int, int] = {}  # a job's bundle size, where this dispatch knows it
        if budget > 0:
            if len(jobs) == 1:
                job = request.job
                room = min(budget, free_slots(job, production=False))
                # No room, nothing to size: the sweeper's periodic dispatch of a request
                # held at its gates does not read the job's history.
                sizes[job.pk] = bundle_size(request, job, queued=request.max_active_intervals) if room > 0 else 1
                if in_publication and in_flight and room < sizes[job.pk]:
                    # Cheap work whose slots come free one at a time: wait for a bundle's
                    # worth (the publications still in flight dispatch again).
                    return 0
                candidates = _candidates(request, job, room)
            else:
                candidates = _cascade_candidates(request, budget)
            queued: dict[int, list[Run]] = {}
            candidates = list(candidates)
            for interval in candidates:
                interval.request = request
            # One UPDATE queues them all and one INSERT creates their runs.
            intervals_transition(candidates, to=I.QUEUED, data=lambda interval: {},
                                 dataset=lambda interval: jobs[interval.job_id].dataset.name)
            now = timezone.now()
            runs = Run.objects.bulk_create([Run(
                job=jobs[interval.job_id], run_type=RunType.BACKFILL, request=request, interval=interval,
                partition_key=interval.partition_key, data_interval_start=interval.start,
                data_interval_end=interval.end, code_version_id=interval.code_version_id, enqueued_at=now,
            ) for interval in candidates])
            # The code each run will execute, by its hash: what an auditor can compare
            # with the catalog and the repository (the row's id alone says nothing).
            code_hashes = dict(CodeVersion.objects.filter(pk__in={r.code_version_id for r in runs})
                               .values_list("pk", "hash"))
            for run in runs:
                job = run.job
                audit_record(actor=None, action="run.created", object_type="run", object_id=run.pk,
                             request_id=request.pk, dataset=job.dataset.name, to_state=RunStatus.QUEUED,
                             data={"run_id": run.run_id, "partition": run.partition_key, "run_type": run.run_type,
                                   "code_version": run.code_version_id,
                                   "code_hash": code_hashes.get(run.code_version_id)})
                queued.setdefault(job.pk, []).append(run)
                created += 1
            for job_id, runs in queued.items():
                _send_runs(request, jobs[job_id], runs, size=sizes.get(job_id))
        if not created:  # what it queued is work left
            request_check_done(request)
    return created


# How many of a job's latest finished runs tell whether its intervals are cheap.
CHEAP_SAMPLE = 5


def bundle_size(request: BackfillRequest, job: Job, *, queued: int) -> int:
    """How many of the `queued` runs of `job` this dispatch of `request` may send in one
    bundle: 1 (each alone) unless bundles are on (EXECUTION_BUNDLE_SIZE), the job has
    no side effects and does not depend on its past, the request does not verify
    twice, and the job's last CHEAP_SAMPLE finished runs each took at most
    EXECUTION_BUNDLE_MAX_SECONDS (their median): only cheap work is worth it, and a job
    never run yet is not known to be cheap (a bundled run's time is its bundle's, from
    the claim of all its runs to their publication: bundles go on while a whole bundle
    takes at most that long). At most what the gates let run at once (the request's
    max active intervals; the job's, its team's and its pool's limits) divided by
    EXECUTION_BUNDLE_LANES, the worker processes serving backfills: the work keeps a
    lane for each, so bundles never idle a worker that runs alone would keep busy."""
    pool = job.pool
    at_once = min(request.max_active_intervals, job.max_concurrent_runs, job.dataset.team.max_concurrent_runs,
                  pool.slots - pool.reserved_for_production)
    size = min(settings.EXECUTION_BUNDLE_SIZE, queued, at_once // settings.EXECUTION_BUNDLE_LANES)
    if size < 2 or job.has_side_effects or job.depends_on_past or request.verify_twice:
        return 1
    took = [(end - start).total_seconds() for start, end in
            Run.objects.filter(job=job, status=RunStatus.PUBLISHED, started_at__isnull=False, finished_at__isnull=False)
            .order_by("-pk").values_list("started_at", "finished_at")[:CHEAP_SAMPLE]]
    if len(took) < CHEAP_SAMPLE or statistics.median(took) > settings.EXECUTION_BUNDLE_MAX_SECONDS:
        return 1
    return size


def _send_runs(request: BackfillRequest, job: Job, runs: list[Run], *, size: int | None = None) -> None:
    """The execute messages of the runs one dispatch queued for `job`: in bundles of up
    to `size` (`bundle_size`, asked here if not given) where its intervals are cheap
    (services/bundles.py), else one a run."""
    if len(runs) < 2:
        size = 1
    elif size is None:
        size = bundle_size(request, job, queued=len(runs))
    for first in range(0, len(runs), size):
        bundle = runs[first:first + size]
        if len(bundle) == 1:
            enqueue_execute(bundle[0], stamped=True)
        else:
            enqueue("execution.execute_bundle", [run.run_id for run in bundle], queue=BACKFILL_QUEUE,
                    headers={"request_id": request.pk, "job": job.name, "run_ids": [run.run_id for run in bundle]})


def request_check_done(request: BackfillRequest) -> None:
    """No work left: reconciling when nothing failed, failed otherwise. Planned
    intervals blocked behind a failed upstream count as no work left."""
    if request.status != R.RUNNING:
        return
    intervals = Interval.objects.filter(request=request)
    if intervals.filter(status__in=[I.QUEUED, I.RUNNING]).exists():
        return
    failed = intervals.filter(status=I.FAILED).count()
    if intervals.filter(status=I.PLANNED).exists() and (not failed or not _all_planned_blocked(request)):
        return
    if failed:
        request_fail(request, failed=failed)
    else:
        request_reconciling(request)


def _all_planned_blocked(request: BackfillRequest) -> bool:
    """Whether every planned interval waits on a failed one it can never get past:
    an earlier interval of a depends_on_past job, or an upstream interval it reads."""
    rows, jobs, producers = _request_graph(request)
    dead = (I.FAILED, I.CANCELLED)
    for _pk, job_id, position, start, end, status in rows:
        if status != I.PLANNED:
            continue
        blocked = jobs[job_id].depends_on_past and any(
            r[1] == job_id and r[2] < position and r[5] in dead for r in rows)
        blocked = blocked or any(
            r[1] in producers[job_id] and r[3] < end and r[4] > start and r[5] in dead for r in rows)
        if not blocked:
            return False
    return True


def request_retry_failed(*, actor, request_id) -> BackfillRequest:
    """Failed runs get new attempts on the same frozen code version; published
    intervals are left alone."""
    request = request_get(request_id)
    require_operate(actor, request, "request.retry_failed")
    if request.status not in (R.FAILED, R.RUNNING):
        raise ConflictError(f"request #{request.pk} is {request.status}; only a failed or running request "
                            "can retry its failed intervals", field="status")
    return run_again_if_deadlocked(lambda: _retry_failed(actor, request_get(request_id)),
                                   what=f"retrying the failed intervals of request #{request.pk}")


def _retry_failed(actor, request: BackfillRequest) -> BackfillRequest:
    with transaction.atomic():
        audit_serialise()  # the audit chain's lock before the request's rows, as cancel (core/retry.py)
        failed = list(Interval.objects.filter(request=request, status=I.FAILED))
        if not failed:
            raise ConflictError(f"request #{request.pk} has no failed intervals", field="status")
        if request.status == R.FAILED:
            request_resume_after_failure(request, actor=actor, failed=len(failed))
        for interval in failed:
            interval.request = request
            run = Run.objects.filter(interval=interval).order_by("-id").first()
            if run is not None and run.status == RunStatus.FAILED:
                run_transition(run, to=RunStatus.QUEUED, actor=actor, reason="retry failed", updates={"retry_at": None})
                interval_transition(interval, to=I.QUEUED, actor=actor, reason="retry failed")
                enqueue_execute(run)
            else:
                # The run cannot be retried (verification failed: its output is wrong for
                # this code); plan the interval again so a new run is created.
                interval_transition(interval, to=I.QUEUED, actor=actor, reason="retry failed")
                interval_transition(interval, to=I.PLANNED, actor=actor, reason="new run")
        enqueue("execution.dispatch_request", request.pk, headers={"request_id": request.pk})
    return request


def request_stop_runs(*, request_id: int, actor=None, reason: str = "") -> int:
    """After a cancel commits (backfills calls it through its run control, naming who
    cancelled and why: the runs' audit rows are theirs), and from the sweeper when that
    hand-off was lost (the system's): queued and running work stops; nothing partial
    becomes visible (the publish of a cancelled run is refused by its state). Returns
    how many runs and intervals it stopped (0: nothing was left, e.g. someone stopped
    them already)."""
    why = f"request cancelled: {reason}" if reason else "request cancelled"

    def stop() -> int:
        stopped = 0
        with transaction.atomic():
            # The audit chain's lock first, then the request's rows, as the cancel does
            # (core/retry.py): a worker's publication holds it while it moves them.
            audit_serialise()
            request_lock(request_id)
            request = BackfillRequest.objects.select_related("job__dataset").get(pk=request_id)
            # Not a verified run: its publication may be under way (the pointer switched,
            # the metadata not yet), and cancelling it then left readers on a cancelled
            # run's version with no publication recorded. It is complete and checked: it
            # publishes (here or by the sweeper), and its interval with it.
            publishing = list(Run.objects.filter(request=request, status=RunStatus.VERIFIED, interval__isnull=False)
                              .values_list("interval_id", flat=True))
            for run in Run.objects.filter(request=request, status__in=RUN_ACTIVE - {RunStatus.VERIFIED}) \
                    .select_related("job__dataset"):
                run_transition(run, to=RunStatus.CANCELLED, actor=actor, reason=why,
                               updates={"finished_at": timezone.now()})
                stopped += 1
                for attempt in Attempt.objects.filter(run=run, status=AttemptStatus.RUNNING).select_related("run"):
                    attempt_transition(attempt, to=AttemptStatus.FAILED, actor=actor, reason=why,
                                       updates={"finished_at": timezone.now(), "error": "cancelled"})
            for frm in (I.QUEUED, I.RUNNING, I.FAILED):
                stopped += intervals_bulk_transition(request, frm=frm, to=I.CANCELLED, actor=actor, reason=why,
                                                     keep=publishing)
        return stopped

    # A run a worker moved between the read and its transition (running -> staged) is a
    # lost race, not a reason to stop stopping: read them again, as for a deadlock.
    return run_again_if_deadlocked(stop, what=f"stopping the runs of request #{request_id}", also=(ConflictError,))


def warehouse_probe_and_resume() -> int:
    """With a warehouse outage open, probe; once a connection succeeds, send again what
    waited for it: queued runs (at their backoff, if one is still running), staged and
    verified runs, and the dispatch of every running request. Duplicates are harmless
    (tasks claim first). Returns how many messages were sent (0: nothing to resume)."""
    if warehouse_outage_probe() is None:
        return 0
    sent = 0
    waiting = Run.objects.filter(status__in=[RunStatus.QUEUED, RunStatus.STAGED, RunStatus.VERIFIED]).select_related("job")
    now = timezone.now()
    for run in waiting:
        with transaction.atomic():
            if run.status == RunStatus.QUEUED:
                enqueue_execute(run, at=run.retry_at if run.retry_at and run.retry_at > now else None)
            else:
                enqueue_verify(run)
        sent += 1
    for pk in BackfillRequest.objects.filter(status=R.RUNNING, paused=False).values_list("pk", flat=True):
        with transaction.atomic():
            enqueue("execution.dispatch_request", pk, headers={"request_id": pk})
        sent += 1
    return sent


def dispatch_all() -> int:
    """The periodic safety net: dispatch every running request."""
    total = 0
    for pk in BackfillRequest.objects.filter(status=R.RUNNING, paused=False).values_list("pk", flat=True):
        total += dispatch_request(request_id=pk)
    return total
