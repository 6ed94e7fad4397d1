"""Published partitions whose rows are far from their baseline: what readers see now
that nobody would have published on purpose (the demo's 2 a.m. incident: a day
published with twice its rows by an append-style rerun).

The baseline is the one verification and reconciliation use: the median row count of
the BASELINE_WINDOW published partitions before it (catalog/tolerances.py); the band is
the dataset's `row_band`. One query over the current versions; the medians in one pass
per dataset.
"""
from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass

from backfill_portal.catalog.tolerances import BASELINE_WINDOW, DEFAULT_ROW_BAND
from backfill_portal.execution.choices import RunStatus
from backfill_portal.warehouse.models import Version


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


def partition_anomalies(*, limit: int = 10, datasets: list[str] | None = None) -> list[Anomaly]:
    """The current (published) partitions whose row count is outside their dataset's
    row band around the trailing median, furthest first."""
    versions = Version.objects.filter(run__status=RunStatus.PUBLISHED, dataset__is_source=False)
    if datasets is not None:
        versions = versions.filter(dataset__name__in=datasets)
    rows = (versions.order_by("dataset_id", "partition_key")
            .values_list("dataset__name", "run__job__name", "dataset__owner__username", "dataset__tolerances", "partition_key",
                         "row_count", "run__run_id", "run_id", "run__request_id"))
    by_dataset: dict[str, list[tuple]] = defaultdict(list)
    for row in rows:
        by_dataset[row[0]].append(row)
    found: list[Anomaly] = []
    for name, items in by_dataset.items():
        band = float((items[0][3] or {}).get("row_band", DEFAULT_ROW_BAND))
        counts = [r[5] for r in items]
        for i, (_, job, owner, _, key, count, run_id, run_pk, request_id) in enumerate(items):
            window = counts[max(0, i - BASELINE_WINDOW):i]
            if len(window) < 3:  # too little history to call anything unusual
                continue
            baseline = float(statistics.median(window))
            if baseline and abs(count - baseline) > band * baseline:
                found.append(Anomaly(dataset=name, job=job, owner=owner, partition_key=key, rows=count, baseline=baseline,
                                     run_id=run_id, run_pk=run_pk, request_id=request_id))
    found.sort(key=lambda a: (-abs(a.ratio - 1), a.dataset, a.partition_key))
    return found[:limit]
