"""Published partitions whose rows are far from their baseline: what readers see now
that nobody would have published on purpose (the demo's 2 a.m. incident: a day
published with twice its rows by an append-style rerun).

The baseline is the one verification and reconciliation use: the median row count of
the BASELINE_WINDOW published partitions before it (catalog/tolerances.py); the band is
the dataset's `row_band`. It is taken once, when the version is staged, and kept on the
version with its ratio (`Version.baseline_rows`, `row_ratio`), so finding the anomalies
among however many published partitions is one index range scan per dataset, not a
pass over every current version (at 1M runs that pass was ~60 ms of the on-call home;
docs/performance.md). A partition's baseline is therefore the one it was published
against: a later republication of its neighbours does not move it.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass

from django.db.models import Q

from backfill_portal.catalog.models import Dataset
from backfill_portal.catalog.tolerances import BASELINE_WINDOW, DEFAULT_ROW_BAND
from backfill_portal.execution.choices import RunStatus
from backfill_portal.warehouse.models import Version

# Fewer published partitions before one than this, and nothing is called unusual.
MIN_BASELINE_PARTITIONS = 3
# Versions outside their band that are read to find the current ones among them (older
# ones were superseded or rolled back): far more than a home page shows.
MAX_CANDIDATES = 2000


@dataclass(frozen=True)
class Anomaly:
    dataset: str
    job: str
    owner: str
    partition_key: str
    rows: int
    baseline: float
    run_id: str
    run_pk: int
    request_id: int | None

    @property
    def ratio(self) -> float:
        return self.rows / self.baseline if self.baseline else 0.0

    @property
    def summary(self) -> str:
        return f"{self.rows:,} rows, {self.ratio:.1f}x the baseline of {self.baseline:,.0f}"


def trailing_row_counts(dataset_id: int, partition_key: str, window: int = BASELINE_WINDOW) -> list[int]:
    """Row counts of the published partitions of the dataset just before this one,
    nearest first (the `(dataset, partition_key, id)` index)."""
    return list(
        Version.objects.filter(dataset_id=dataset_id, run__status=RunStatus.PUBLISHED, partition_key__lt=partition_key)
        .order_by("-partition_key").values_list("row_count", flat=True)[:window]
    )


def trailing_row_counts_of(dataset_id: int, partition_keys: list[str], window: int = BASELINE_WINDOW
                           ) -> dict[str, list[int]]:
    """`trailing_row_counts` of several partitions of one dataset in one read: the
    published versions before the last of them, as many as the window plus the
    partitions (enough when they are neighbours); a partition that read does not cover
    is read on its own."""
    keys = sorted(set(partition_keys))
    limit = window + len(keys)
    rows = list(
        Version.objects.filter(dataset_id=dataset_id, run__status=RunStatus.PUBLISHED, partition_key__lt=keys[-1])
        .order_by("-partition_key").values_list("partition_key", "row_count")[:limit]
    )
    counts = {}
    for key in keys:
        before = [count for partition, count in rows if partition < key][:window]
        # A full read may have stopped short of this partition's window; a short one holds all.
        counts[key] = before if len(before) == window or len(rows) < limit else trailing_row_counts(
            dataset_id, key, window)
    return counts


def baseline_of(row_count: int, counts: list[int]) -> tuple[float | None, float | None]:
    """(baseline_rows, row_ratio) of a version with `row_count` rows whose trailing
    published partitions have `counts`: the ratio only over a window of at least
    MIN_BASELINE_PARTITIONS and a baseline above zero."""
    if not counts:
        return None, None
    baseline = float(statistics.median(counts))
    if len(counts) < MIN_BASELINE_PARTITIONS or not baseline:
        return baseline, None
    return baseline, row_count / baseline


def partition_anomalies(*, limit: int = 10, datasets: list[str] | None = None) -> list[Anomaly]:
    """The current (published) partitions whose row count is outside their dataset's
    row band around their baseline, furthest first."""
    owned = Dataset.objects.filter(is_source=False)
    if datasets is not None:
        owned = owned.filter(name__in=datasets)
    outside = Q()
    for pk, tolerances in owned.values_list("pk", "tolerances"):
        band = float((tolerances or {}).get("row_band", DEFAULT_ROW_BAND))
        outside |= Q(dataset_id=pk) & (Q(row_ratio__gt=1 + band) | Q(row_ratio__lt=1 - band))
    if not outside:
        return []
    # The candidates first, by the partial index alone; then which of them readers see.
    # In one query the planners may drive from the runs' status index instead, visiting
    # every published run (SQLite did, ~60 ms at 1M runs).
    candidates = list(Version.objects.filter(outside, row_ratio__isnull=False).order_by("-pk")
                      .values_list("pk", flat=True)[:MAX_CANDIDATES])
    if not candidates:
        return []
    rows = (Version.objects.filter(pk__in=candidates, run__status=RunStatus.PUBLISHED)
            .values_list("dataset__name", "run__job__name", "dataset__owner__username", "partition_key",
                         "row_count", "baseline_rows", "run__run_id", "run_id", "run__request_id"))
    found = [Anomaly(dataset=name, job=job, owner=owner, partition_key=key, rows=count, baseline=baseline,
                     run_id=run_id, run_pk=run_pk, request_id=request_id)
             for name, job, owner, key, count, baseline, run_id, run_pk, request_id in rows]
    found.sort(key=lambda a: (-abs(a.ratio - 1), a.dataset, a.partition_key))
    return found[:limit]
