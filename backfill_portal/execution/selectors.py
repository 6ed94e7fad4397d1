"""Reads of runs that services and pages share."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache

from django.conf import settings
from django.db.models import Count, DateTimeField, F, Max, OuterRef, QuerySet, Subquery
from django.db.models.functions import Coalesce, Greatest, Substr
from django.utils import timezone

from backfill_portal.backends import get_warehouse
from backfill_portal.backfills.choices import IntervalStatus
from backfill_portal.backfills.models import Interval
from backfill_portal.core.models import AuditEvent
from backfill_portal.execution.choices import AttemptStatus, RunStatus, RunType
from backfill_portal.execution.executors.base import ExecutionError, pins_recorded, render
from backfill_portal.execution.models import Attempt, CheckResult, Run
from backfill_portal.execution.transitions import RUN_ACTIVE


def run_list() -> QuerySet[Run]:
    return Run.objects.select_related("job__dataset", "code_version", "request")


def run_get(run_id: str) -> Run | None:
    # run_id is unique: no ORDER BY (the model's default ordering is cleared), and only
    # the relations every task reads. Each join multiplies PostgreSQL's planning time,
    # and every task of every interval makes this call.
    return next(iter(Run.objects.select_related("job__dataset", "code_version", "request", "interval")
                     .filter(run_id=run_id).order_by()), None)


def intervals_rolled_back(request, *, job_id: int | None = None, within: str = "") -> QuerySet[Interval]:
    """The request's published intervals whose version was rolled back since: the run
    that published one is `rolled_back` now. An interval's lifecycle ends at published,
    and a rollback marks the run, not the interval; should that run be published again
    (the run lifecycle's rolled_back -> published edge), its interval is no longer one
    of these. `job_id` and `within` (a partition-key prefix) narrow it as in
    `interval_cells`. Read from the rolled-back runs (the run's request index): a
    request that was never rolled back costs one empty index range."""
    runs = Run.objects.filter(request=request, status=RunStatus.ROLLED_BACK, interval__isnull=False)
    qs = Interval.objects.filter(request=request, status=IntervalStatus.PUBLISHED, pk__in=runs.values("interval_id"))
    if job_id is not None:
        qs = qs.filter(job_id=job_id)
    if within:
        qs = qs.filter(partition_key__startswith=within)
    return qs


def intervals_rolled_back_counts(request, *, key_prefix: int, job_id: int | None = None,
                                 within: str = "") -> list[tuple[int, str, int]]:
    """`intervals_rolled_back` counted per (job, bucket), a bucket being the first
    `key_prefix` characters of the partition key, as `backfills.selectors.interval_counts`
    buckets every interval: [(job_id, bucket, count)]. One GROUP BY."""
    rows = (intervals_rolled_back(request, job_id=job_id, within=within).order_by()
            .annotate(bucket=Substr("partition_key", 1, key_prefix)).values_list("job_id", "bucket")
            .annotate(n=Count("id")))
    return list(rows)


def progress_with_rollbacks(request, counts: dict[str, int]) -> dict[str, int]:
    """The request's interval counts by status (`backfills.selectors.request_progress`
    or the calendar's) with its published intervals whose version was since rolled back
    (`intervals_rolled_back`) counted apart, as `rolled_back`, and no longer as
    `published`. No query when nothing was published, nor when `counts` already holds
    `rolled_back` (the calendar counts them as it draws their cells)."""
    if "rolled_back" in counts:
        return counts
    published = counts.get(IntervalStatus.PUBLISHED) or 0
    rolled_back = intervals_rolled_back(request).count() if published else 0
    return {**counts, IntervalStatus.PUBLISHED.value: published - rolled_back, "rolled_back": rolled_back}


def verification_original(verification: Run) -> Run | None:
    """The backfill run a verification run recomputes: the latest one of the same
    interval created before it (a retry of the interval creates a new original later)."""
    return (Run.objects.select_related("job__dataset", "request", "interval")
            .filter(interval_id=verification.interval_id, run_type=RunType.BACKFILL, pk__lt=verification.pk)
            .order_by("-pk").first())


# --- The runs list: failing and stuck first -------------------------------------------------


@cache
def run_last_alive() -> Greatest:
    """When an active run last showed life: sent to a worker, started, beating (an
    attempt's heartbeat or its verifier's), or the time its backoff lets it retry (in
    the future while it waits, so a waiting run is never stuck).

    Built once: a query resolves a copy of it, and the copy keeps the expression's
    identity (a hash Django takes through inspect.signature for every node). Measured
    on the stuck-runs query at 1M runs (SQLite): 2.64 -> 2.45 ms, a small saving."""
    beat = (Attempt.objects.filter(run=OuterRef("pk")).order_by().values("run")
            .annotate(last=Max("heartbeat_at")).values("last"))
    created = F("created_at")
    return Greatest(
        created, Coalesce("enqueued_at", created), Coalesce("started_at", created),
        Coalesce("verify_heartbeat_at", created), Coalesce("retry_at", created),
        Coalesce(Subquery(beat, output_field=DateTimeField()), created),
    )


def runs_stuck(qs: QuerySet[Run], *, now: datetime | None = None) -> QuerySet[Run]:
    """Active runs with no sign of life for RUN_STUCK_AFTER_SECONDS: the sweeper
    re-sends a lost message and expires a dead attempt well within that, so a run still
    silent after it needs a person. Each carries `moved_at`, when it last showed life
    (run_last_alive)."""
    cutoff = (now or timezone.now()) - timedelta(seconds=settings.RUN_STUCK_AFTER_SECONDS)
    return qs.filter(status__in=RUN_ACTIVE).annotate(moved_at=run_last_alive()).filter(moved_at__lt=cutoff)


def runs_failing(qs: QuerySet[Run]) -> QuerySet[Run]:
    """Failed or verification-failed runs whose partition no later run of the same job
    has published since (the failure still stands): Run.failing, which
    execution.transitions keeps, read by its (failing, id) index."""
    return qs.filter(failing=True)


@dataclass(frozen=True)
class RunFilters:
    """The runs list's filters; empty values filter nothing. `state` is a run status, or
    "failing" / "stuck" (see runs_failing / runs_stuck)."""

    state: str = ""
    job: str = ""
    dataset: str = ""
    run_type: str = ""
    request: int | None = None
    since: datetime | None = None
    until: datetime | None = None


# What a row of a run table shows (web/templatetags/tables.py), and no more: a full run
# with its request is ~40 columns, most of them datetimes, and building 150 of them took
# longer than the page's SQL (docs/performance.md).
RUN_ROW_FIELDS = ("run_id", "job__name", "job__dataset__name", "partition_key", "run_type", "status",
                  "request_id", "created_at", "started_at", "finished_at", "error")


# A run table's row as a values() mapping (web/templatetags/tables.py reads these keys):
# 150 model instances of even these columns took ~4 ms to build.
RUN_ROW_VALUES = ("pk", *RUN_ROW_FIELDS, "job__dataset_id")


def run_row_list() -> QuerySet[Run]:
    """Runs with the columns a run table shows (RUN_ROW_FIELDS)."""
    return Run.objects.select_related("job__dataset").only(*RUN_ROW_FIELDS)


def run_row_values(qs: QuerySet[Run]) -> QuerySet:
    """`qs` as run table rows (RUN_ROW_VALUES), with `moved_at` when runs_stuck set it."""
    return qs.values(*RUN_ROW_VALUES, *(["moved_at"] if "moved_at" in qs.query.annotations else []))


def run_rows(filters: RunFilters) -> QuerySet[Run]:
    """Runs matching the filters (created in [since, until)), with what the list shows."""
    qs = run_row_list()
    if filters.job:
        qs = qs.filter(job__name=filters.job)
    if filters.dataset:
        qs = qs.filter(job__dataset__name=filters.dataset)
    if filters.run_type:
        qs = qs.filter(run_type=filters.run_type)
    if filters.request is not None:
        qs = qs.filter(request_id=filters.request)
    if filters.since is not None:
        qs = qs.filter(created_at__gte=filters.since)
    if filters.until is not None:
        qs = qs.filter(created_at__lt=filters.until)
    if filters.state == "failing":
        qs = runs_failing(qs)
    elif filters.state == "stuck":
        qs = runs_stuck(qs)
    elif filters.state:
        qs = qs.filter(status=filters.state)
    return qs


# --- The run page ---------------------------------------------------------------------------

# What a run's state means as a phase of its work (the run page's time per phase).
PHASE_OF = {
    RunStatus.QUEUED: "queued", RunStatus.RUNNING: "staging", RunStatus.STAGED: "verifying",
    RunStatus.VERIFYING: "verifying", RunStatus.VERIFIED: "publishing", RunStatus.FAILED: "failed, waiting for a retry",
}


@dataclass(frozen=True)
class Phase:
    name: str
    started: datetime
    ended: datetime | None  # None: still in it
    seconds: float


def run_phases(run: Run, *, now: datetime | None = None) -> list[Phase]:
    """Time per phase (queued, staging, verifying, publishing), from the run's audited
    transitions: each state lasts until the next transition. Consecutive states of one
    phase (staged, verifying) merge; a retried run shows each pass."""
    events = list(AuditEvent.objects.filter(object_type="run", object_id=str(run.pk))
                  .order_by("id").values_list("at", "to_state"))
    now = now or timezone.now()
    marks = [(run.created_at, RunStatus.QUEUED)] + [(at, state) for at, state in events if state]
    phases: list[Phase] = []
    for (start, state), nxt in zip(marks, [*marks[1:], None]):
        name = PHASE_OF.get(state)
        if name is None:  # a final state: the run's work ended here
            break
        end = nxt[0] if nxt else None
        if phases and phases[-1].name == name and phases[-1].ended == start:
            first = phases.pop()
            start = first.started
        phases.append(Phase(name, start, end, max(0.0, ((end or now) - start).total_seconds())))
    return phases


def run_rendered_sql(run: Run) -> tuple[str | None, str]:
    """(the SELECT this run staged, rendered against the inputs it pinned, a note). No
    SQL for a kind whose definition has no template; none before the run pinned its
    inputs (it renders against exactly those, at its start)."""
    definition = run.code_version.definition or {}
    template = definition.get("sql")
    if not template:
        return None, f"A {definition.get('kind', run.job.kind)} job runs its code, not a SQL template."
    pins = pins_recorded(run)
    if pins is None:
        return None, "Rendered when the run starts: it reads the versions it pins then."
    try:
        return render(template, run=run, warehouse=get_warehouse(), pins=pins), ""
    except ExecutionError as exc:
        return None, f"The template does not render: {exc}"


def run_verdict(run: Run, attempts: list[Attempt], checks: list[CheckResult]) -> str:
    """Why a run whose attempt succeeded did not publish: the attempt only wrote the
    version and its commit marker; verification then refused it."""
    if run.status != RunStatus.VERIFICATION_FAILED:
        return ""
    if not any(a.status == AttemptStatus.SUCCEEDED for a in attempts):
        return ""
    lead = ("The attempt succeeded: it wrote the version and its commit marker. Verification then refused "
            "the version, so it was never published and readers still see the previous one.")
    failed = [c for c in checks if c.blocking and not c.passed]
    if failed:
        named = "; ".join(f"{c.name}: {c.message or 'failed'}" for c in failed)
        return f"{lead} Failed blocking check{'s' if len(failed) > 1 else ''}: {named}."
    return f"{lead} {run.error or 'Verification could not run.'}"


def interval_cells(request, *, job_id: int | None = None, within: str = "",
                   limit: int | None = None) -> list[tuple[int, str, str, str | None]]:
    """(job_id, partition_key, status, run_id of its latest run or None) of each interval
    of `request`, in (job, position) order; `job_id` and `within` (a partition-key
    prefix) narrow it; `limit` caps the rows read. One query: the latest run is a
    correlated subquery on the run's interval index."""
    latest = Run.objects.filter(interval=OuterRef("pk")).order_by("-id").values("run_id")[:1]
    qs = Interval.objects.filter(request=request)
    if job_id is not None:
        qs = qs.filter(job_id=job_id)
    if within:
        qs = qs.filter(partition_key__startswith=within)
    rows = (qs.order_by("job_id", "position").annotate(run=Subquery(latest))
            .values_list("job_id", "partition_key", "status", "run"))
    return list(rows[:limit] if limit is not None else rows)
