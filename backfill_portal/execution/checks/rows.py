"""Checks on the version's own numbers (the warehouse profile): rows, baseline, keys."""
from __future__ import annotations

import statistics

from backfill_portal.catalog.tolerances import BASELINE_WINDOW, DEFAULT_ROW_BAND
from backfill_portal.execution.anomalies import trailing_row_counts
from backfill_portal.execution.checks.registry import register_check
from backfill_portal.execution.checks.base import CheckContext, VerificationCheck
from backfill_portal.execution.models import Run
from backfill_portal.warehouse.models import Version


def trailing_baseline(run: Run, window: int = BASELINE_WINDOW) -> float | None:
    """Median row count of the trailing published partitions of this dataset."""
    counts = trailing_row_counts(run.job.dataset_id, run.partition_key, window)
    return float(statistics.median(counts)) if counts else None


@register_check
class RowCountPositive(VerificationCheck):
    name = "row_count_positive"
    order = 100

    def run(self, ctx: CheckContext):
        rows = ctx.profile.row_count
        yield self.result(rows > 0, observed={"rows": rows}, message="" if rows > 0 else "the version has no rows")


@register_check
class RowCountBaseline(VerificationCheck):
    """Within a band (tolerances.row_band, catalog/tolerances.py's default) of the trailing
    median; a warning unless tolerances.row_band_blocking."""

    name = "row_count_baseline"
    order = 200

    def run(self, ctx: CheckContext):
        rows, tol = ctx.profile.row_count, ctx.tolerances
        # The baseline the version was staged against (Version.baseline_rows, taken when
        # it was recorded: execution/anomalies.py), or the trailing median now for a
        # version recorded without one. Read through the run (a bundle prefetches its
        # runs' versions in one query).
        try:
            staged = ctx.run.version.baseline_rows
        except Version.DoesNotExist:
            staged = None
        baseline = staged if staged is not None else trailing_baseline(ctx.run)
        band = float(tol.get("row_band", DEFAULT_ROW_BAND))
        if baseline:
            low, high = baseline * (1 - band), baseline * (1 + band)
            ok = low <= rows <= high
            yield self.result(ok, blocking=bool(tol.get("row_band_blocking", False)),
                              observed={"rows": rows, "baseline": baseline, "band": band},
                              message="" if ok else f"{rows} rows is outside {low:.0f}..{high:.0f}")
        else:
            yield self.result(True, blocking=False, observed={"rows": rows},
                              message="no trailing published partitions yet")


@register_check
class UniqueBusinessKey(VerificationCheck):
    name = "unique_business_key"
    order = 300

    def run(self, ctx: CheckContext):
        profile = ctx.profile
        yield self.result(profile.duplicate_keys == 0,
                          observed={"rows": profile.row_count, "distinct_keys": profile.distinct_keys,
                                    "duplicate_keys": profile.duplicate_keys},
                          message="" if profile.duplicate_keys == 0 else f"{profile.duplicate_keys} duplicate key(s)")


@register_check
class NoNullBusinessKey(VerificationCheck):
    name = "no_null_business_key"
    order = 400

    def run(self, ctx: CheckContext):
        nulls = ctx.profile.null_keys
        yield self.result(nulls == 0, observed={"null_keys": nulls},
                          message="" if nulls == 0 else f"{nulls} row(s) with a NULL key")
