"""What an approver needs to see before saying yes (the approvals page reads it):

1. per job the request rebuilds, the code version it runs (frozen at submission) and its
   diff against each code version that produced the partitions readers see now, with
   who introduced the new version and why (the catalog sync's audit row);
2. the SQL of the first interval, rendered against the versions published now;
3. the estimated work: the warehouse's own estimate of that statement (EXPLAIN) and the
   durations of the job's past runs;
4. the partitions that will change: the current version of each (run, rows, code) or
   none yet.

Reads only; nothing here writes a pin, a consumption or a run.
"""
from __future__ import annotations

import difflib
import json
import statistics
from collections import defaultdict
from dataclasses import dataclass, field

from backfill_portal.backends import Estimate, get_warehouse
from backfill_portal.backfills.choices import IntervalStatus
from backfill_portal.backfills.models import BackfillRequest, Interval
from backfill_portal.catalog.calendar import previous_partition
from backfill_portal.catalog.models import CodeVersion, Job
from backfill_portal.core.models import AuditEvent
from backfill_portal.execution.choices import RunStatus
from backfill_portal.execution.executors.base import ExecutionError, PinnedInputs, covered_partitions, render, \
    upstreams_of
from backfill_portal.execution.models import Run

PAST_RUNS = 50
SHOWN_PARTITIONS = 200


@dataclass
class CodeDiff:
    """The request's code against one code version that produced published partitions."""

    published: CodeVersion
    partitions: list[str]
    lines: list[str]  # a unified diff, empty when the code is the same
    introduced: dict | None = None  # who made `published` the job's code, when and why

    @property
    def same(self) -> bool:
        return not self.lines

    @property
    def tagged(self) -> list[tuple[str, str]]:
        """The diff's lines tagged for colouring: meta, hunk, add, del or ctx."""
        out = []
        for line in self.lines:
            kind = ("meta" if line.startswith(("+++", "---")) else "hunk" if line.startswith("@@")
                    else "add" if line.startswith("+") else "del" if line.startswith("-") else "ctx")
            out.append((kind, line))
        return out


@dataclass
class PartitionChange:
    partition_key: str
    run_id: str = ""
    rows: int | None = None
    code: str = ""


@dataclass
class JobReview:
    job: Job
    code_version: CodeVersion | None
    introduced: dict | None
    diffs: list[CodeDiff]
    changes: list[PartitionChange]
    total: int
    new_partitions: int
    durations: dict
    kind_text: str = ""

    @property
    def changed_code(self) -> list[CodeDiff]:
        return [d for d in self.diffs if not d.same]


@dataclass
class RequestReview:
    jobs: list[JobReview] = field(default_factory=list)
    first_interval: Interval | None = None
    rendered_sql: str = ""
    render_note: str = ""
    estimate: Estimate | None = None  # the warehouse's EXPLAIN of the rendered SQL
    estimated_seconds: float | None = None


def definition_lines(definition: dict) -> list[str]:
    """A code version as the lines a diff compares: the SQL as written, then every other
    key of the definition (callable, params, side-effect target) as JSON."""
    lines = []
    sql = definition.get("sql")
    if sql:
        lines += sql.rstrip("\n").split("\n")
    for key in sorted(k for k in definition if k != "sql"):
        lines.append(f"-- {key}: {json.dumps(definition[key], sort_keys=True)}")
    return lines


def code_diff(old: CodeVersion, new: CodeVersion) -> list[str]:
    if old.hash == new.hash:
        return []
    return list(difflib.unified_diff(definition_lines(old.definition), definition_lines(new.definition),
                                     fromfile=f"published: {old.short_hash}", tofile=f"this request: {new.short_hash}",
                                     lineterm="", n=3))


def code_version_introduced(job: Job, version: CodeVersion) -> dict | None:
    """Who made `version` the job's code, when and why: the latest catalog sync that did."""
    event = (AuditEvent.objects.filter(action="catalog.code_version", object_type="job", object_id=job.name,
                                       data__to=version.short_hash).order_by("-id").first())
    if event is None:
        return None
    return {"actor": event.actor_name, "at": event.at, "reason": event.reason, "event_id": event.pk}


def past_durations(job: Job) -> dict:
    """Seconds per run of the job's latest published runs (started -> finished)."""
    rows = (Run.objects.filter(job=job, status__in=[RunStatus.PUBLISHED, RunStatus.SUPERSEDED,
                                                   RunStatus.ROLLED_BACK],
                               started_at__isnull=False, finished_at__isnull=False)
            .order_by("-id").values_list("started_at", "finished_at")[:PAST_RUNS])
    seconds = sorted((end - start).total_seconds() for start, end in rows if end >= start)
    if not seconds:
        return {"runs": 0}
    return {"runs": len(seconds), "median": statistics.median(seconds), "longest": seconds[-1],
            "p90": seconds[min(len(seconds) - 1, int(len(seconds) * 0.9))]}


def _planned(request: BackfillRequest) -> dict[int, list[tuple[int, str, int | None]]]:
    """Each job's planned intervals as (id, partition, code version id), in plan order:
    tuples, not model instances (a 27,000-interval request built 120,000 instances,
    with their code versions and runs, for a page that shows 200 partitions)."""
    by_job: dict[int, list[tuple[int, str, int | None]]] = defaultdict(list)
    for job_id, pk, key, code_version_id in (
            Interval.objects.filter(request=request).exclude(status=IntervalStatus.SKIPPED)
            .order_by("job_id", "position").values_list("job_id", "pk", "partition_key", "code_version_id")):
        by_job[job_id].append((pk, key, code_version_id))
    return by_job


def _review_job(job: Job, intervals: list[tuple[int, str, int | None]], request: BackfillRequest,
                warehouse) -> JobReview:
    frozen = next((code_version_id for _, _, code_version_id in intervals if code_version_id), None)
    version = CodeVersion.objects.filter(pk=frozen).first() if frozen else None
    if version is None:
        version = request.code_version if job.pk == request.job_id and request.code_version_id else \
            job.current_code_version
    partitions = [key for _, key, _ in intervals]
    current = warehouse.current_many(job.dataset.name, partitions) if not job.has_side_effects else {}
    runs = {run_id: (code_version_id, rows, code_hash) for run_id, code_version_id, rows, code_hash in
            Run.objects.filter(run_id__in=list(current.values()))
            .values_list("run_id", "code_version_id", "version__row_count", "code_version__hash")}
    produced: dict[int, list[str]] = defaultdict(list)
    changes = []
    for key in partitions:
        run_id = current.get(key, "")
        if run_id not in runs:
            changes.append(PartitionChange(key))
            continue
        code_version_id, rows, code_hash = runs[run_id]
        produced[code_version_id].append(key)
        changes.append(PartitionChange(key, run_id, rows, (code_hash or "")[:12]))
    versions = CodeVersion.objects.in_bulk(list(produced))
    diffs = [CodeDiff(published=versions[pk], partitions=keys, lines=code_diff(versions[pk], version) if version else [],
                      introduced=code_version_introduced(job, versions[pk]))
             for pk, keys in sorted(produced.items(), key=lambda kv: -len(kv[1]))]
    kind_text = ""
    if version is not None and not version.definition.get("sql"):
        kind_text = f"a {job.kind} job: no SQL to render; its definition is in the diff"
    return JobReview(job=job, code_version=version,
                     introduced=code_version_introduced(job, version) if version else None,
                     diffs=diffs, changes=changes[:SHOWN_PARTITIONS], total=len(changes),
                     new_partitions=sum(1 for c in changes if not c.run_id), durations=past_durations(job),
                     kind_text=kind_text)


def preview_pins(run: Run, warehouse) -> PinnedInputs:
    """What the run would pin if it started now: every upstream's current versions over
    its interval, and its own previous partition for a depends_on_past job."""
    pins = PinnedInputs()
    job = run.job
    for up in upstreams_of(job):
        if up.is_source:
            pins.sources.add(up.name)
        else:
            pins.versions[up.name] = warehouse.current_many(
                up.name, covered_partitions(up, run.data_interval_start, run.data_interval_end))
    if job.depends_on_past:
        prev_key = previous_partition(grain=job.dataset.grain, timezone=job.dataset.timezone,
                                      partition_key=run.partition_key)
        prev_run = warehouse.current(job.dataset.name, prev_key)
        if prev_run:
            pins.previous[prev_key] = prev_run
    return pins


def request_review(request: BackfillRequest) -> RequestReview:
    warehouse = get_warehouse()
    planned = _planned(request)
    jobs = {j.pk: j for j in Job.objects.filter(pk__in=list(planned)).select_related(
        "dataset", "current_code_version")}
    review = RequestReview()
    # The target first, then the cascade's nodes in the order the request planned them.
    order = sorted(planned, key=lambda pk: (pk != request.job_id, planned[pk][0][0]))
    for pk in order:
        review.jobs.append(_review_job(jobs[pk], planned[pk], request, warehouse))
    target = planned.get(request.job_id) or (planned[order[0]] if order else [])
    if not target:
        return review
    first = review.first_interval = Interval.objects.get(pk=target[0][0])
    job_review = review.jobs[0]
    version = job_review.code_version
    sql = (version.definition.get("sql") if version else "") or ""
    if sql:
        run = Run(job=job_review.job, partition_key=first.partition_key, data_interval_start=first.start,
                  data_interval_end=first.end, code_version=version)
        try:
            review.rendered_sql = render(sql, run=run, warehouse=warehouse, pins=preview_pins(run, warehouse))
        except ExecutionError as exc:
            review.render_note = f"the template does not render: {exc}"
        else:
            review.estimate = warehouse.explain(review.rendered_sql)
    else:
        review.render_note = job_review.kind_text or "no SQL to render"
    seconds = 0.0
    for jr in review.jobs:
        median = jr.durations.get("median")
        if median is None:
            continue
        parallel = max(1, min(request.max_active_intervals, jr.job.max_concurrent_runs))
        seconds += jr.total * median / parallel
    review.estimated_seconds = seconds if any(jr.durations.get("runs") for jr in review.jobs) else None
    return review
