"""A new job kind in one file: `seed`, a small table whose rows are written in the
catalog (a calendar of holidays, a mapping of categories), staged into every partition
it is run for like any other version: isolated, checked, published atomically."""
from __future__ import annotations

from backfill_portal.catalog.kinds import JobKindBase, register_kind
from backfill_portal.execution.executors import ExecutionContext, register_executor


@register_kind
class SeedKind(JobKindBase):
    name = "seed"
    label = "Rows written in the catalog"
    required = {"rows": "{kind} job {job} has no rows"}  # copied into the code version
    reads_inputs = False  # a seed reads no upstream: `reads` is refused at load

    def validate(self, config, *, job, reads):
        rows = config["rows"]
        if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
            yield "rows", f"seed job {job}: rows must be a list of mappings"


@register_executor("seed")
def execute_seed(ctx: ExecutionContext):
    columns = [c["name"] for c in ctx.run.job.dataset.columns]
    ctx.record_output_columns(sorted({name for row in ctx.definition["rows"] for name in row}))
    return ctx.stage_rows(tuple(row.get(c) for c in columns) for row in ctx.definition["rows"])
