"""A new verification check in one file: `row_count_ceiling` fails, and blocks
publication, when a version has more rows than its dataset's `tolerances.max_rows`
(datasets without that tolerance are not checked)."""
from __future__ import annotations

from backfill_portal.execution.checks import CheckContext, VerificationCheck, register_check


@register_check
class RowCountCeiling(VerificationCheck):
    name = "row_count_ceiling"
    order = 450  # after the key checks, before declared_schema (500)
    blocking = True

    def run(self, ctx: CheckContext):
        ceiling = ctx.tolerances.get("max_rows")
        if ceiling is None:
            return
        rows = ctx.profile.row_count
        yield self.result(rows <= ceiling, observed={"rows": rows, "max_rows": ceiling},
                          message="" if rows <= ceiling else f"{rows} rows is over the ceiling of {ceiling}")
