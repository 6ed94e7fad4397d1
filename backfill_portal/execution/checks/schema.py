"""The version's columns are exactly the dataset's declared ones."""
from __future__ import annotations

from backfill_portal.execution.checks.registry import register_check
from backfill_portal.execution.checks.base import CheckContext, VerificationCheck


@register_check
class DeclaredSchema(VerificationCheck):
    name = "declared_schema"
    order = 500

    def run(self, ctx: CheckContext):
        declared = [c["name"] for c in ctx.dataset.columns]
        produced = list(ctx.run.output_columns or declared)
        extra = sorted(set(produced) - set(declared))
        missing = sorted(set(declared) - set(produced))
        yield self.result(not extra and not missing, observed={"declared": declared, "produced": produced},
                          message="; ".join(filter(None, [f"undeclared: {', '.join(extra)}" if extra else "",
                                                          f"missing: {', '.join(missing)}" if missing else ""])))
