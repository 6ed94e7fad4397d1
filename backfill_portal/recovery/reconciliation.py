"""Reconciliation: "done" means reconciled, not "all runs green" (DESIGN invariant 9).

For a request, the *manifest* (intervals planned, runs created, versions published and
the exceptions by name) and, per interval, the *four numbers* side by side:

1. rows: before (the version current when the request was submitted), after (the
   version this request published), baseline (median of the trailing partitions as
   they stood at submission, so the request's own output cannot vouch for itself);
2. business keys: rows versus distinct keys and NULL keys;
3. the core measure versus the source (the `measure_vs_source` check when the
   dataset declares one);
4. what the nearest downstream dataset shows for that partition now.

An interval whose published version was built from an input rolled back later (it is
in a rollback's contaminated closure) is `unexplained`, with the reason, until someone
explains it after the rollback.

Each interval is `matched`, `explained`, `unexplained` or `skipped` (not run on
purpose: a side-effect node not authorised, a node the requester skipped; nothing was
compared, so it is not "matched"); sign-off is refused while any is unexplained.
Several intervals may be explained with one reason (`intervals_explain`). All warehouse numbers come from grouped queries over every run of
the request at once (the backend's profile_many, measure_many, current_many), never one
query per interval.
"""
from __future__ import annotations

import bisect
import statistics
from collections import defaultdict
from dataclasses import dataclass
from types import SimpleNamespace

from django.db import connection, transaction
from django.db.models import Count, Exists, OuterRef, Q
from django.utils import timezone

from backfill_portal.backfills.choices import IntervalStatus as I
from backfill_portal.backfills.choices import RequestStatus as R
from backfill_portal.backfills import policy
from backfill_portal.backfills.models import BackfillRequest, Interval, Reconciliation, ReconciliationRow, Verdict
from backfill_portal.backfills.selectors import request_get
from backfill_portal.backfills.services.lifecycle import request_complete
from backfill_portal.catalog.calendar import partition_for
from backfill_portal.catalog.models import Dataset, Job
from backfill_portal.catalog.tolerances import BASELINE_WINDOW, DEFAULT_MEASURE_REL, DEFAULT_ROW_BAND
from backfill_portal.core.errors import ConflictError, NotFound, ValidationError
from backfill_portal.core.models import AuditEvent
from backfill_portal.core.retry import run_again_if_deadlocked
from backfill_portal.core.services.audit import audit_record
from backfill_portal.execution.choices import AttemptStatus, RunStatus, RunType
from backfill_portal.execution.models import CheckResult, Run
from backfill_portal.execution.transitions import RUN_ACTIVE
from backfill_portal.recovery.locks import serialise_reconciliation, serialise_rollbacks
from backfill_portal.warehouse.models import Consumption, Contamination, Publication
from backfill_portal.backends import get_warehouse
from backfill_portal.catalog.specs import spec_for
from backfill_portal.warehouse.selectors import contamination_status, publications_in_effect

_CHUNK = 500
# A run whose version was published at some point (it may since have been replaced).
_WAS_PUBLISHED = (RunStatus.PUBLISHED, RunStatus.SUPERSEDED, RunStatus.ROLLED_BACK)
_NOT_YET = (R.DRAFT, R.PENDING_APPROVAL, R.APPROVED, R.REJECTED)


def _chunks(items: list, size: int = _CHUNK):
    for i in range(0, len(items), size):
        yield items[i:i + size]


# -- the numbers --------------------------------------------------------------------------


@dataclass
class _VersionInfo:
    version_pk: int
    run_pk: int
    run_id: str
    row_count: int
    fingerprint: str
    purged: bool


def _before_world(dataset: Dataset, *, first: str, last: str, cutoff) -> dict[str, _VersionInfo]:
    """{partition: the version in effect at `cutoff`} for the request's partitions and
    the BASELINE_WINDOW published partitions before them, from the publication history."""
    trailing = list(
        Publication.objects.filter(dataset=dataset, partition_key__lt=first, published_at__lte=cutoff)
        .order_by("-partition_key").values_list("partition_key", flat=True).distinct()[:BASELINE_WINDOW]
    )
    lower = min(trailing) if trailing else first
    latest: dict[str, tuple] = {}
    rows = (Publication.objects.filter(dataset=dataset, partition_key__gte=lower, partition_key__lte=last,
                                       published_at__lte=cutoff)
            .values_list("partition_key", "id", "version_id", "version__run_id", "version__run__run_id",
                         "version__row_count", "version__fingerprint", "version__purged_at"))
    for row in rows:
        if row[0] not in latest or row[1] > latest[row[0]][1]:
            latest[row[0]] = row
    return {p: _VersionInfo(version_pk=r[2], run_pk=r[3], run_id=r[4], row_count=r[5], fingerprint=r[6],
                            purged=r[7] is not None) for p, r in latest.items()}


def _baselines(before: dict[str, _VersionInfo], partitions: list[str]) -> dict[str, float | None]:
    """Median row count of the BASELINE_WINDOW partitions before each one, as they stood
    at submission (one pass over the sorted keys)."""
    keys = sorted(before)
    counts = [before[k].row_count for k in keys]
    out: dict[str, float | None] = {}
    for partition in partitions:
        i = bisect.bisect_left(keys, partition)
        window = counts[max(0, i - BASELINE_WINDOW):i]
        out[partition] = float(statistics.median(window)) if window else None
    return out


def _nearest_downstream(dataset: Dataset) -> Dataset | None:
    """The dataset built directly from this one that best shows "this partition, one
    step downstream": not a side-effect node; preferably with a core measure, the same
    grain and timezone, and not cumulative (depends on its own past); then by name."""
    jobs = list(Job.objects.filter(upstreams=dataset).exclude(has_side_effects=True).select_related("dataset"))
    if not jobs:
        return None
    best = min(jobs, key=lambda j: (not j.dataset.core_measure, j.depends_on_past,
                                    (j.dataset.grain, j.dataset.timezone) != (dataset.grain, dataset.timezone),
                                    j.dataset.name))
    return best.dataset


def _inputs(run_pks: list[int]) -> dict[int, dict[tuple[int, str], tuple]]:
    """{run pk: {(input dataset id, partition): (is_source, watermark, version fingerprint)}}"""
    out: dict[int, dict] = defaultdict(dict)
    for chunk in _chunks(sorted(set(run_pks))):
        for run_pk, ds_id, part, is_source, watermark, fp in Consumption.objects.filter(run_id__in=chunk).values_list(
                "run_id", "dataset_id", "partition_key", "dataset__is_source", "watermark", "version__fingerprint"):
            out[run_pk][(ds_id, part)] = (is_source, watermark, fp)
    return out


def _recomputed(after_inputs: dict, before_inputs: dict) -> list[str]:
    """Which inputs changed since the previous version read them: a source whose
    watermark moved, or an input version with a different fingerprint. For a
    depends_on_past job that includes its own previous partition: a partition rebuilt
    because an earlier one was republished moved with it, and must say so."""
    changed = []
    for (ds_id, part), (is_source, watermark, fp) in after_inputs.items():
        if (ds_id, part) not in before_inputs:
            continue
        _, old_watermark, old_fp = before_inputs[(ds_id, part)]
        if is_source and watermark and old_watermark and watermark != old_watermark:
            changed.append(f"{ds_id}:{part}")
        elif not is_source and fp and old_fp and fp != old_fp:
            changed.append(f"{ds_id}:{part}")
    return changed


def _tolerances(dataset: Dataset) -> tuple[float, float]:
    tol = dataset.tolerances or {}
    return float(tol.get("row_band", DEFAULT_ROW_BAND)), float(tol.get("measure_rel", DEFAULT_MEASURE_REL))


def _measure_differs(a: float | None, b: float | None, rel: float) -> bool:
    if a is None or b is None:
        return False
    return abs(a - b) > rel * max(abs(b), 1.0)


def _deviations(row: SimpleNamespace, *, band: float, rel: float, skipped: bool) -> list[str]:
    """What needs an explanation. Empty: matched."""
    out: list[str] = []
    if not row.after_run_id:
        if not skipped:
            out.append(f"not published: interval is {row.interval_status}")
        return out
    if row.rows_baseline and abs(row.rows_after - row.rows_baseline) > band * row.rows_baseline:
        out.append(f"rows {row.rows_after} vs baseline {row.rows_baseline:g} is beyond ±{band:.0%}")
    if row.rows_after is not None and row.distinct_keys is not None:
        duplicates = row.rows_after - (row.null_keys or 0) - row.distinct_keys
        if duplicates:
            out.append(f"{duplicates} duplicate business key(s)")
    if row.null_keys:
        out.append(f"{row.null_keys} row(s) with a NULL business key")
    if _measure_differs(row.measure_after, row.measure_source, rel):
        out.append(f"measure {row.measure_after:g} vs source {row.measure_source:g} is beyond {rel:g}")
    if row.recomputed and row.rows_before is not None:
        rows_moved = (row.rows_after is not None
                      and abs(row.rows_after - row.rows_before) > band * max(row.rows_before, 1))
        if rows_moved or _measure_differs(row.measure_after, row.measure_before, rel):
            out.append(f"recomputed against current upstream: rows {row.rows_before} -> {row.rows_after}, "
                       f"measure {row.measure_before} -> {row.measure_after}")
    return out


def _verdict(deviations: list[str], explanation: str) -> str:
    if not deviations:
        return Verdict.MATCHED
    return Verdict.EXPLAINED if explanation.strip() else Verdict.UNEXPLAINED


def _rolled_back_runs(run_pks: list[int]) -> dict[int, tuple]:
    """{run pk: (when, why)} for the runs whose version was rolled back (one partition
    of a request that goes on): readers no longer see what the row's numbers describe,
    so the row is not "matched" until someone explains it."""
    out: dict[int, tuple] = {}
    for chunk in _chunks(run_pks):
        for run_pk, at, restored, actor in (
                Publication.objects.filter(previous_version__run_id__in=chunk, action=Publication.Action.ROLLBACK)
                .order_by("id").values_list("previous_version__run_id", "published_at", "version__run__run_id",
                                            "actor__username")):
            out[run_pk] = (at, f"rolled back by {actor or 'system'} at {at:%Y-%m-%d %H:%M}: readers see "
                               f"{restored} instead")
    return out


def _contaminations(run_pks: list[int]) -> dict[int, tuple]:
    """{run pk: (when the rollback found it, why)} for the runs whose version is in a
    rollback's contaminated closure (the nearest entry when there are several)."""
    rows = []
    for chunk in _chunks(sorted(set(run_pks))):
        rows += list(Contamination.objects.filter(version__run_id__in=chunk).select_related(
            "version", "via__run", "via__dataset", "rolled_back__run", "rolled_back__dataset", "rollback", "rebuild")
            .order_by("-depth", "-id"))
    current = publications_in_effect(rows) if rows else {}
    out: dict[int, tuple] = {}
    for r in rows:  # nearest last: it wins
        rb, via = r.rolled_back, r.via
        status = contamination_status(r, current.get((r.dataset_id, r.partition_key)))
        out[r.version.run_id] = (r.found_at, (
            f"{status['message']}: {rb.dataset.name}/{rb.partition_key} version {rb.run.run_id} was rolled back "
            f"at {r.found_at:%Y-%m-%d %H:%M} UTC ({r.rollback.reason}); reached through {via.dataset.name}/"
            f"{via.partition_key} version {via.run.run_id}, {r.depth} step(s) away"))
    return out


# The row's columns, in model order. Rows are built as plain namespaces and written
# with one executemany: for 2,000 intervals, model instances and bulk_create (34 rows
# per statement under SQLite's parameter cap) cost more than all the warehouse
# aggregates together (benchmarks/reconcile.py).
_ROW_FIELDS = [f for f in ReconciliationRow._meta.concrete_fields if not f.primary_key]
_ROW_DEFAULTS = {f.attname: (f.get_default() if f.has_default() else None) for f in _ROW_FIELDS}
_ROW_PREPARED = {f.attname for f in _ROW_FIELDS if f.get_internal_type() in ("JSONField", "DateTimeField")}


def _new_row(**values) -> SimpleNamespace:
    return SimpleNamespace(**{**_ROW_DEFAULTS, **values})


def _insert_rows(rows: list[SimpleNamespace]) -> None:
    table = connection.ops.quote_name(ReconciliationRow._meta.db_table)
    columns = ", ".join(connection.ops.quote_name(f.column) for f in _ROW_FIELDS)
    marks = ", ".join(["%s"] * len(_ROW_FIELDS))
    params = []
    for row in rows:
        values = vars(row)
        params.append([f.get_db_prep_save(values[f.attname], connection) if f.attname in _ROW_PREPARED
                       else values[f.attname] for f in _ROW_FIELDS])
    with connection.cursor() as cursor:
        for i in range(0, len(params), 1000):
            cursor.executemany(f"INSERT INTO {table} ({columns}) VALUES ({marks})", params[i:i + 1000])


def _compute_rows(request: BackfillRequest, now) -> list[SimpleNamespace]:
    """1. Per job of the request: its intervals, the run that published each, and the
       version in effect at submission; 2. the warehouse numbers of all those versions
       and of the downstream ones in grouped queries; 3. one row per interval."""
    warehouse = get_warehouse()
    cutoff = request.submitted_at or request.requested_at
    existing = {r["interval_id"]: r for r in ReconciliationRow.objects.filter(request=request).values(
        "interval_id", "explanation", "explained_by_id", "explained_at")}
    skipped_intervals = set()
    rows: list[SimpleNamespace] = []
    intervals = list(Interval.objects.filter(request=request).order_by("job_id", "position")
                     .values("id", "job_id", "position", "partition_key", "start", "status"))
    by_job: dict[int, list[dict]] = defaultdict(list)
    for iv in intervals:
        by_job[iv["job_id"]].append(iv)
        # Not run on purpose: skipped by the plan, or cancelled with the request (a
        # decision with its reason in the audit log and under exceptions.cancelled),
        # so nothing was compared and nothing awaits an explanation.
        if iv["status"] in (I.SKIPPED, I.CANCELLED):
            skipped_intervals.add(iv["id"])
    after_runs: dict[int, tuple[int, str]] = {}
    for pk, run_id, interval_id in (Run.objects.filter(request=request, run_type=RunType.BACKFILL,
                                                       status__in=_WAS_PUBLISHED)
                                    .order_by("id").values_list("id", "run_id", "interval_id")):
        after_runs[interval_id] = (pk, run_id)  # the latest one wins
    contaminated = _contaminations([pk for pk, _ in after_runs.values()])
    taken_away = _rolled_back_runs([pk for pk, _ in after_runs.values()])
    source_measures = {
        run_pk: observed for run_pk, observed in CheckResult.objects.filter(
            run__request=request, name="measure_vs_source").values_list("run_id", "observed")}

    for job in Job.objects.filter(pk__in=list(by_job)).select_related("dataset"):
        dataset = job.dataset
        spec = spec_for(dataset)
        band, rel = _tolerances(dataset)
        ivs = by_job[job.pk]
        partitions = [iv["partition_key"] for iv in ivs]
        before = _before_world(dataset, first=min(partitions), last=max(partitions), cutoff=cutoff)
        baselines = _baselines(before, partitions)
        before_runs = {p: before[p] for p in partitions if p in before}
        after_ids = [after_runs[iv["id"]][1] for iv in ivs if iv["id"] in after_runs]
        numbers = warehouse.profile_many(spec=spec, run_ids=after_ids + [
            v.run_id for v in before_runs.values() if not v.purged])
        inputs = _inputs([after_runs[iv["id"]][0] for iv in ivs if iv["id"] in after_runs]
                         + [v.run_pk for v in before_runs.values()])
        downstream = _nearest_downstream(dataset)
        down_parts: dict[str, str] = {}
        down_current: dict[str, str] = {}
        down_values: dict[str, float | None] = {}
        down_reads: dict[str, str] = {}
        if downstream is not None and not downstream.is_source:
            same_grain = (downstream.grain, downstream.timezone) == (dataset.grain, dataset.timezone)
            for iv in ivs:
                down_parts[iv["partition_key"]] = iv["partition_key"] if same_grain else partition_for(
                    grain=downstream.grain, timezone=downstream.timezone, at=iv["start"]).partition_key
            down_current = warehouse.current_many(downstream.name, list(down_parts.values()))
            down_values = warehouse.measure_many(spec=spec_for(downstream), run_ids=down_current.values())
            for chunk in _chunks(sorted(set(down_current.values()))):
                for run_id, part, read_run in Consumption.objects.filter(
                        run__run_id__in=chunk, dataset=dataset).values_list(
                        "run__run_id", "partition_key", "version__run__run_id"):
                    down_reads[f"{run_id}|{part}"] = read_run or ""

        for iv in ivs:
            key = iv["partition_key"]
            prior = existing.get(iv["id"], {})
            row = _new_row(
                request_id=request.pk, interval_id=iv["id"], job_id=job.pk, dataset_id=dataset.pk,
                position=iv["position"], partition_key=key, interval_status=iv["status"], computed_at=now,
                explanation=prior.get("explanation", ""), explained_by_id=prior.get("explained_by_id"),
                explained_at=prior.get("explained_at"), rows_baseline=baselines.get(key),
            )
            prev = before_runs.get(key)
            if prev is not None:
                row.before_run_id = prev.run_id
                row.rows_before = prev.row_count
                if prev.run_id in numbers:
                    row.measure_before = numbers[prev.run_id].measure_sum
            after = after_runs.get(iv["id"])
            if after is not None:
                run_pk, run_id = after
                row.after_run_id = run_id
                got = numbers.get(run_id)
                if got is not None:
                    row.rows_after, row.distinct_keys, row.null_keys = got.row_count, got.distinct_keys, got.null_keys
                    row.measure_after = got.measure_sum
                observed = source_measures.get(run_pk) or {}
                if observed.get("source") is not None:
                    row.measure_source = float(observed["source"])
                if prev is not None and prev.run_id != run_id:
                    row.recomputed = bool(_recomputed(inputs.get(run_pk, {}), inputs.get(prev.run_pk, {})))
            if downstream is not None:
                row.downstream_dataset = downstream.name
                row.downstream_partition = down_parts.get(key, "")
                down_run = down_current.get(row.downstream_partition, "")
                row.downstream_run_id = down_run
                row.downstream_value = down_values.get(down_run) if down_run else None
                if down_run and row.after_run_id:
                    row.downstream_reads_after = down_reads.get(f"{down_run}|{key}") == row.after_run_id
            skipped = iv["id"] in skipped_intervals
            row.deviations = _deviations(row, band=band, rel=rel, skipped=skipped)
            row.verdict = Verdict.SKIPPED if skipped and not row.deviations else _verdict(row.deviations,
                                                                                          row.explanation)
            mark = contaminated.get(after[0]) if after is not None else None
            if mark is None and after is not None:
                mark = taken_away.get(after[0])
            if mark is not None:
                found_at, why = mark
                row.deviations.append(why)
                # An explanation written before the rollback explained something else;
                # one written since explains it (the verdict above saw no deviation yet).
                if row.explained_at is None or row.explained_at < found_at or not row.explanation:
                    row.verdict = Verdict.UNEXPLAINED
                else:
                    row.verdict = Verdict.EXPLAINED
            rows.append(row)
    return rows


# -- the manifest ---------------------------------------------------------------------------


def request_manifest(request: BackfillRequest) -> dict:
    """Intervals planned, runs created, versions published, and the exceptions by name."""
    intervals = {iv["id"]: iv for iv in Interval.objects.filter(request=request).values(
        "id", "partition_key", "status", "note", "job__name")}
    by_status: dict[str, int] = defaultdict(int)
    for iv in intervals.values():
        by_status[iv["status"]] += 1
    runs = Run.objects.filter(request=request)
    backfill_runs = runs.filter(run_type=RunType.BACKFILL)
    publishes = list(Publication.objects.filter(request=request, action=Publication.Action.PUBLISH)
                     .values("id", "dataset__name", "partition_key", "version_id", "version__run__run_id",
                             "version__run__status"))
    reasons = dict(
        AuditEvent.objects.filter(request_id=request.pk, object_type="interval",
                                  action__in=["interval.skipped", "interval.cancelled"])
        .values_list("object_id", "reason"))

    def _why(iv: dict, default: str) -> str:
        return reasons.get(str(iv["id"])) or iv["note"] or default

    failed_runs = {}
    for interval_id, run_id, error in backfill_runs.filter(
            status__in=[RunStatus.FAILED, RunStatus.VERIFICATION_FAILED]).order_by("id").values_list(
            "interval_id", "run_id", "error"):
        failed_runs[interval_id] = (run_id, error)
    retrying = list(
        runs.filter(status__in=RUN_ACTIVE)
        .annotate(failed_attempts=Count("attempts", filter=Q(attempts__status__in=[AttemptStatus.FAILED,
                                                                                    AttemptStatus.LOST])))
        .filter(failed_attempts__gt=0).values("run_id", "partition_key", "failed_attempts"))
    per_partition: dict[tuple[str, str], list[str]] = defaultdict(list)
    for p in publishes:
        per_partition[(p["dataset__name"], p["partition_key"])].append(p["version__run__run_id"])
    superseded_versions = [p["version_id"] for p in publishes if p["version__run__status"] == RunStatus.SUPERSEDED]
    superseded = []
    for chunk in _chunks(superseded_versions):
        for pub in (Publication.objects.filter(previous_version_id__in=chunk, action=Publication.Action.PUBLISH)
                    .exclude(request=request).values("dataset__name", "partition_key", "previous_version__run__run_id",
                                                     "request_id", "version__run__run_id")):
            superseded.append({"dataset": pub["dataset__name"], "partition_key": pub["partition_key"],
                               "run_id": pub["previous_version__run__run_id"], "by_request": pub["request_id"],
                               "by_run_id": pub["version__run__run_id"]})
    return {
        "intervals_planned": len(intervals),
        "intervals_by_status": dict(sorted(by_status.items())),
        "runs_created": backfill_runs.count(),
        "verification_runs": runs.filter(run_type=RunType.VERIFICATION).count(),
        "versions_published": len({p["version_id"] for p in publishes}),
        **_version_fates(publishes),
        "exceptions": {
            "skipped": [{"job": iv["job__name"], "partition_key": iv["partition_key"],
                         "why": _why(iv, "skipped")} for iv in intervals.values() if iv["status"] == I.SKIPPED],
            "cancelled": [{"job": iv["job__name"], "partition_key": iv["partition_key"],
                           "why": _why(iv, "request cancelled")}
                          for iv in intervals.values() if iv["status"] == I.CANCELLED],
            "failed": [{"job": iv["job__name"], "partition_key": iv["partition_key"],
                        "run_id": failed_runs.get(iv["id"], ("", ""))[0],
                        "error": failed_runs.get(iv["id"], ("", ""))[1][:500]}
                       for iv in intervals.values() if iv["status"] == I.FAILED],
            "still_retrying": [{"run_id": r["run_id"], "partition_key": r["partition_key"],
                                "failed_attempts": r["failed_attempts"]} for r in retrying],
            "published_more_than_once": [{"dataset": d, "partition_key": p, "run_ids": ids}
                                         for (d, p), ids in sorted(per_partition.items()) if len(ids) > 1],
            "superseded_by_another_request": sorted(superseded, key=lambda s: (s["dataset"], s["partition_key"])),
            "rolled_back": rolled_back_items(request),
            "non_deterministic": list(
                CheckResult.objects.filter(run__request=request, name="second_rerun", passed=False)
                .values_list("run__partition_key", flat=True)),
        },
    }


def _version_fates(publishes: list[dict]) -> dict:
    """Of the versions a request published, how many readers see now and how many a
    rollback took away (the intervals' lifecycle ends at published; the run says what
    became of its version)."""
    fate = {p["version_id"]: p["version__run__status"] for p in publishes}
    return {"versions_current": sum(1 for s in fate.values() if s == RunStatus.PUBLISHED),
            "versions_rolled_back": sum(1 for s in fate.values() if s == RunStatus.ROLLED_BACK)}


def manifest_now(request: BackfillRequest, manifest: dict | None) -> dict:
    """A stored manifest (frozen when its numbers were computed or signed off) with what
    a rollback since has changed read now: the rolled-back exceptions and what readers see."""
    manifest = dict(manifest or {})
    if not manifest:
        return manifest
    manifest["exceptions"] = {**(manifest.get("exceptions") or {}), "rolled_back": rolled_back_items(request)}
    manifest.update(_version_fates(list(
        Publication.objects.filter(request=request, action=Publication.Action.PUBLISH)
        .values("version_id", "version__run__status"))))
    return manifest


def rolled_back_items(request: BackfillRequest) -> list[dict]:
    """What was rolled back of what this request published, by name: the dataset and
    partition, the version taken away, the version readers see instead, who did it,
    when and why. Read from the publication history at the time of asking, so a
    reconciliation signed off before the rollback still says it."""
    mine = list(Publication.objects.filter(request=request, action=Publication.Action.PUBLISH,
                                           version__run__status=RunStatus.ROLLED_BACK)
                .values_list("version_id", flat=True))
    out = []
    for chunk in _chunks(sorted(set(mine))):
        for pub in (Publication.objects.filter(previous_version_id__in=chunk, action=Publication.Action.ROLLBACK)
                    .select_related("dataset", "version__run", "previous_version__run", "actor")
                    .order_by("dataset__name", "partition_key", "id")):
            out.append({"dataset": pub.dataset.name, "partition_key": pub.partition_key,
                        "run_id": pub.previous_version.run.run_id, "restored_run_id": pub.version.run.run_id,
                        "by": pub.actor.username if pub.actor else "system", "at": pub.published_at.isoformat(),
                        "why": pub.reason})
    return out


# -- services ------------------------------------------------------------------------------


def reconciliation_compute(*, actor, request_id, only_if_stale: bool = False) -> Reconciliation:
    """Compute (or recompute) the manifest and the rows of a request.

    1. Refused before anything ran, and once signed off (the signed numbers stay).
    2. Compute every row from grouped queries; explanations already written are kept.
    3. Replace the rows, store the manifest and write one audit row, in one transaction.
    """
    request = request_get(request_id)
    if request.status in _NOT_YET:
        raise ConflictError(f"request #{request.pk} is {request.status}; nothing ran yet to reconcile", field="status")
    with transaction.atomic():
        # One at a time per request, and the rows read, computed and replaced under the
        # lock: two at once inserted the same rows (a 500), and one that had read before
        # a sign-off overwrote the signed numbers, or an explanation written meanwhile.
        serialise_reconciliation(request.pk)
        existing = Reconciliation.objects.filter(request=request).first()
        if existing is not None and existing.signed_off_at is not None:
            raise ConflictError(f"request #{request.pk} was signed off; its reconciliation is final", field="status")
        if only_if_stale and existing is not None and not _stale(existing, request):
            return existing  # someone computed it while this one waited
        now = timezone.now()
        rows = _compute_rows(request, now)
        manifest = request_manifest(request)
        counts = {v: sum(1 for r in rows if r.verdict == v) for v in Verdict.values}
        manifest["verdicts"] = counts
        manifest["recomputed"] = sum(1 for r in rows if r.recomputed)
        ReconciliationRow.objects.filter(request=request).delete()
        _insert_rows(rows)
        reconciliation, _ = Reconciliation.objects.update_or_create(
            request=request, defaults={"computed_at": now, "manifest": manifest})
        audit_record(actor=actor, action="reconciliation.compute", object_type="request", object_id=request.pk,
                     request_id=request.pk, dataset=request.job.dataset.name,
                     data={**counts, "intervals": len(rows), "recomputed": manifest["recomputed"]})
    return reconciliation


def reconciliation_get(*, request_id, compute_missing: bool = True) -> Reconciliation:
    """The stored reconciliation; computed (as the system) the first time it is asked for."""
    request = request_get(request_id)
    reconciliation = Reconciliation.objects.filter(request=request).select_related("request__job__dataset",
                                                                                    "signed_off_by").first()
    if reconciliation is None:
        if not compute_missing:
            raise NotFound(f"request #{request.pk} has no reconciliation yet")
        reconciliation = reconciliation_compute(actor=None, request_id=request.pk, only_if_stale=True)
    elif reconciliation.signed_off_at is None and _stale(reconciliation, request):
        # Another publication touched these datasets since: the numbers (and the
        # "superseded by another request" exceptions) must show the present.
        try:
            reconciliation = reconciliation_compute(actor=None, request_id=request.pk, only_if_stale=True)
        except ConflictError:  # signed off while this read waited: the signed numbers stand
            reconciliation = Reconciliation.objects.get(request=request)
    return reconciliation


def _stale(reconciliation: Reconciliation, request: BackfillRequest) -> bool:
    """Whether a pointer moved since the numbers were computed on a partition they
    describe: one of the request's own partitions (its version superseded or rolled
    back) or the downstream partition a row reads. A publication anywhere else in the
    same datasets left them as they were; it used to make the next view delete and
    rewrite every row (seconds for a 27,000-interval request, an audit row each time)."""
    own = Interval.objects.filter(request=request, job__dataset_id=OuterRef("dataset_id"),
                                  partition_key=OuterRef("partition_key"))
    downstream = ReconciliationRow.objects.filter(request=request, downstream_dataset=OuterRef("dataset__name"),
                                                  downstream_partition=OuterRef("partition_key"))
    return (Publication.objects.filter(published_at__gt=reconciliation.computed_at)
            .filter(Exists(own) | Exists(downstream)).exists()
            or Contamination.objects.filter(version__run__request=request,
                                            found_at__gt=reconciliation.computed_at).exists())


def reconciliation_rows(reconciliation: Reconciliation, *, verdict: str = ""):
    """The request's rows in (job, position) order; only those of `verdict` if given."""
    rows = (ReconciliationRow.objects.filter(request_id=reconciliation.request_id)
            .select_related("job", "dataset", "explained_by").order_by("job_id", "position"))
    return rows.filter(verdict=verdict) if verdict else rows


def reconciliation_recompute(*, actor, request_id) -> Reconciliation:
    request = request_get(request_id)
    policy.require_review(actor, request, "reconciliation.compute")
    return reconciliation_compute(actor=actor, request_id=request.pk)


def interval_explain(*, actor, request_id, partition_key: str, explanation: str,
                     job: str | None = None) -> ReconciliationRow:
    """A reviewer says why an interval's numbers differ. Refused when empty or when its
    numbers match (400), outside `reconciling` (409) or for someone who is not a
    reviewer (403)."""
    request = request_get(request_id)
    explanation = (explanation or "").strip()
    rows = (ReconciliationRow.objects.filter(request=request, partition_key=partition_key)
            .select_related("dataset", "job"))
    if job:
        rows = rows.filter(job__name=job)
    elif rows.count() > 1:
        rows = rows.filter(job=request.job)
    policy.require_review(actor, request, "reconciliation.explain")
    if job and job not in _job_names(request):
        raise ValidationError(f"job {job[:80]!r} is not part of request #{request.pk}", field="job")
    if not explanation:
        raise ValidationError("say why this interval's numbers differ; an empty explanation explains nothing",
                              field="explanation")
    if request.status != R.RECONCILING:
        raise ConflictError(f"request #{request.pk} is {request.status}; intervals are explained while reconciling",
                            field="status")
    if not Reconciliation.objects.filter(request=request).exists():
        reconciliation_compute(actor=None, request_id=request.pk)
    with transaction.atomic():
        # The row as it is under the lock: a recompute that ran meanwhile replaced them.
        serialise_reconciliation(request.pk)
        row = rows.first()
        if row is None:
            of_job = f" of job {job!r}" if job else ""
            raise NotFound(f"request #{request.pk} has no interval {partition_key!r}{of_job}")
        if Reconciliation.objects.filter(request=request, signed_off_at__isnull=False).exists():
            raise ConflictError(f"request #{request.pk} was signed off; its reconciliation is final", field="status")
        if not row.deviations:  # as for several at once, and as the page offers it
            raise ValidationError(f"nothing to explain in {partition_key!r} of {row.job.name}: its numbers match",
                                  field="explanation")
        before = row.verdict
        verdict = before if before == Verdict.SKIPPED else _verdict(row.deviations, explanation)
        now = timezone.now()
        ReconciliationRow.objects.filter(pk=row.pk).update(explanation=explanation, explained_by=actor,
                                                           explained_at=now, verdict=verdict)
        _refresh_verdict_counts(request)
        audit_record(actor=actor, action="reconciliation.explain", object_type="interval", object_id=row.interval_id,
                     request_id=request.pk, dataset=row.dataset.name, from_state=before, to_state=verdict,
                     reason=explanation, data={"partition": partition_key, "deviations": row.deviations,
                                               **({"replaces": row.explanation} if row.explanation else {})})
    row.refresh_from_db()
    return row


MAX_EXPLAINED_AT_ONCE = 5000


def intervals_explain(*, actor, request_id, intervals: list[tuple[str, str]], explanation: str) -> list[ReconciliationRow]:
    """One reason for several intervals [(job, partition), ...]: all of them or none.
    Refused like one explanation (empty 400, outside `reconciling` 409, not a reviewer
    403), and 400 naming the intervals the request does not have or that have nothing
    to explain. One audit row per interval, as if each had been explained alone."""
    request = request_get(request_id)
    policy.require_review(actor, request, "reconciliation.explain")
    explanation = (explanation or "").strip()
    if not explanation:
        raise ValidationError("say why these intervals' numbers differ; an empty explanation explains nothing",
                              field="explanation")
    wanted = list(dict.fromkeys((job, key) for job, key in intervals))
    if not wanted:
        raise ValidationError("choose the intervals this explanation is for", field="intervals")
    if len(wanted) > MAX_EXPLAINED_AT_ONCE:
        raise ValidationError(f"at most {MAX_EXPLAINED_AT_ONCE} intervals at once", field="intervals")
    if request.status != R.RECONCILING:
        raise ConflictError(f"request #{request.pk} is {request.status}; intervals are explained while reconciling",
                            field="status")
    if not Reconciliation.objects.filter(request=request).exists():
        reconciliation_compute(actor=None, request_id=request.pk)
    covered = _job_names(request)
    strangers = list(dict.fromkeys(job for job, _ in wanted if job not in covered))
    if strangers:
        named = ", ".join(repr(j[:80]) for j in strangers[:10])
        raise ValidationError(f"job {named} is not part of request #{request.pk}" if len(strangers) == 1
                              else f"jobs {named} are not part of request #{request.pk}", field="intervals")
    found = {(r.job.name, r.partition_key): r for r in ReconciliationRow.objects.filter(
        request=request, partition_key__in={k for _, k in wanted}).select_related("job", "dataset")}
    missing = [f"{key!r} of {job}" for job, key in wanted if (job, key) not in found]
    if missing:
        raise ValidationError(f"request #{request.pk} has no interval {', '.join(missing[:10])}"
                              + (f" and {len(missing) - 10} more" if len(missing) > 10 else ""), field="intervals")
    nothing = [f"{key!r} of {job}" for job, key in wanted if not found[(job, key)].deviations]
    if nothing:
        raise ValidationError(f"nothing to explain in {', '.join(nothing[:10])}: its numbers match"
                              + (f" (and {len(nothing) - 10} more)" if len(nothing) > 10 else ""), field="intervals")
    now = timezone.now()
    with transaction.atomic():
        serialise_reconciliation(request.pk)
        # The rows as they are now: a recompute that ran meanwhile replaced them.
        found = {(r.job.name, r.partition_key): r for r in ReconciliationRow.objects.filter(
            request=request, partition_key__in={k for _, k in wanted}).select_related("job", "dataset")}
        if any(k not in found for k in wanted) or Reconciliation.objects.filter(
                request=request, signed_off_at__isnull=False).exists():
            raise ConflictError(f"request #{request.pk}'s reconciliation changed meanwhile; reload and explain again",
                                field="intervals")
        rows = [found[k] for k in wanted]
        for row in rows:
            before, verdict = row.verdict, _verdict(row.deviations, explanation)
            ReconciliationRow.objects.filter(pk=row.pk).update(explanation=explanation, explained_by=actor,
                                                               explained_at=now, verdict=verdict)
            audit_record(actor=actor, action="reconciliation.explain", object_type="interval",
                         object_id=row.interval_id, request_id=request.pk, dataset=row.dataset.name,
                         from_state=before, to_state=verdict, reason=explanation,
                         data={"partition": row.partition_key, "deviations": row.deviations, "together": len(rows),
                               **({"replaces": row.explanation} if row.explanation else {})})
        _refresh_verdict_counts(request)
    return list(ReconciliationRow.objects.filter(pk__in=[r.pk for r in rows]).order_by("job_id", "position"))


def _job_names(request: BackfillRequest) -> set[str]:
    """The jobs a request covers: its target and its cascade's nodes, as the calendar
    checks a `job` parameter."""
    return {request.job.name, *(request.node_actions or {})}


def _refresh_verdict_counts(request: BackfillRequest) -> None:
    reconciliation = Reconciliation.objects.filter(request=request).first()
    if reconciliation is None:
        return
    counts = dict(ReconciliationRow.objects.filter(request=request).values_list("verdict").annotate(n=Count("id")))
    manifest = dict(reconciliation.manifest or {})
    manifest["verdicts"] = {v: counts.get(v, 0) for v in Verdict.values}
    Reconciliation.objects.filter(pk=reconciliation.pk).update(manifest=manifest)


def reconciliation_signoff(*, actor, request_id, comment: str = "") -> BackfillRequest:
    """The target owner signs off: reconciling -> completed.

    1. Only the target owner (an admin when the owner is the requester).
    2. Refused (409) unless the request is reconciling and no interval is unexplained;
       the refusal names the intervals.
    3. Stamp the sign-off and move the request, with its audit row, in one transaction.
    """
    request = request_get(request_id)
    policy.require_sign_off(actor, request)
    if request.status != R.RECONCILING:
        raise ConflictError(f"request #{request.pk} is {request.status}; only a reconciling request is signed off",
                            field="status")
    reconciliation_get(request_id=request.pk)

    def sign() -> BackfillRequest:
        with transaction.atomic():
            # The rows checked are the rows signed: no rollback, recompute or explanation
            # between (a partition rollback at the same moment left a signed-off request
            # showing the rolled-back interval as matched).
            serialise_rollbacks()
            serialise_reconciliation(request.pk)
            current = request_get(request.pk)
            if current.status != R.RECONCILING:
                raise ConflictError(f"request #{current.pk} is {current.status}; only a reconciling request is "
                                    "signed off", field="status")
            reconciliation = Reconciliation.objects.get(request=current)
            if _stale(reconciliation, current):  # something published or rolled back since it was computed
                reconciliation = reconciliation_compute(actor=None, request_id=current.pk)
            unexplained = list(ReconciliationRow.objects.filter(request=current, verdict=Verdict.UNEXPLAINED)
                               .order_by("job_id", "position").values_list("partition_key", flat=True))
            if unexplained:
                shown = ", ".join(unexplained[:20]) + (f" and {len(unexplained) - 20} more"
                                                       if len(unexplained) > 20 else "")
                raise ConflictError(f"{len(unexplained)} interval(s) are unexplained: {shown}; explain them before "
                                    "signing off", fields={"intervals": unexplained})
            claimed = Reconciliation.objects.filter(pk=reconciliation.pk, signed_off_at__isnull=True).update(
                signed_off_by=actor, signed_off_at=timezone.now(), signoff_comment=(comment or "").strip())
            if claimed != 1:
                raise ConflictError(f"request #{current.pk} was signed off already", field="status")
            verdicts = (reconciliation.manifest or {}).get("verdicts", {})
            request_complete(current, actor=actor, reason=(comment or "").strip() or "reconciliation signed off",
                             data={"verdicts": verdicts, "computed_at": reconciliation.computed_at})
            return current

    return run_again_if_deadlocked(sign, what=f"signing off request #{request.pk}")


def reconciliation_signoff_withdraw(*, request: BackfillRequest) -> dict | None:
    """Inside the caller's transaction (a rollback reopening a completed request): the
    sign-off is withdrawn, so the reconciliation can be computed and signed again.
    Returns who had signed off and when (None: nobody had)."""
    signed = Reconciliation.objects.filter(request=request).values("signed_off_by__username", "signed_off_at").first()
    Reconciliation.objects.filter(request=request).update(signed_off_by=None, signed_off_at=None, signoff_comment="")
    return signed and {"by": signed["signed_off_by__username"], "at": signed["signed_off_at"]}


def request_reconcile_when_ready(*, request_id: int) -> str:
    """What the `backfills.reconcile_request` task runs: safe at any time, twice."""
    request = BackfillRequest.objects.filter(pk=request_id).first()
    if request is None:
        return "missing"
    if request.status != R.RECONCILING:
        return f"skipped-{request.status}"
    if Reconciliation.objects.filter(request=request, signed_off_at__isnull=False).exists():
        return "signed-off"
    reconciliation_compute(actor=None, request_id=request_id)
    return "computed"


__all__ = [
    "interval_explain",
    "intervals_explain",
    "reconciliation_compute",
    "reconciliation_get",
    "reconciliation_recompute",
    "reconciliation_rows",
    "reconciliation_signoff",
    "reconciliation_signoff_withdraw",
    "manifest_now",
    "request_manifest",
    "request_reconcile_when_ready",
    "rolled_back_items",
]
