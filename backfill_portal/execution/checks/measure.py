"""The core measure against the source for the same interval (the dataset's
source_measure_sql), within tolerances.measure_rel (catalog/tolerances.py's default)."""
from __future__ import annotations

from backfill_portal.catalog.tolerances import DEFAULT_MEASURE_REL
from backfill_portal.execution.checks.registry import register_check
from backfill_portal.execution.checks.base import CheckContext, VerificationCheck
from backfill_portal.execution.executors.base import ExecutionError


@register_check
class MeasureVsSource(VerificationCheck):
    name = "measure_vs_source"
    order = 700

    def run(self, ctx: CheckContext):
        dataset, warehouse = ctx.dataset, ctx.warehouse
        if not (dataset.source_measure_sql and dataset.core_measure):
            return
        try:
            sql = ctx.render(dataset.source_measure_sql)
            expected = warehouse.query(f"SELECT * FROM ({sql}) AS q")[0][0]
            expected = float(expected or 0)
            actual = float(ctx.profile.measure_sum or 0)
            rel = float(ctx.tolerances.get("measure_rel", DEFAULT_MEASURE_REL))
            ok = abs(actual - expected) <= rel * max(abs(expected), 1.0)
            result = self.result(ok, observed={"measure": dataset.core_measure, "version": actual,
                                               "source": expected, "tolerance": rel},
                                 message="" if ok else f"{dataset.core_measure} {actual:.2f} vs source {expected:.2f}")
        except (ExecutionError, Exception) as exc:  # a broken reconciliation query is a failed check, not a crash
            result = self.result(False, observed={}, message=f"could not compute: {exc}")
        yield result
