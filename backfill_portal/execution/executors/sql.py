"""The `sql` kind: render the frozen SELECT template against the pinned inputs and stage
its result."""
from __future__ import annotations

from backfill_portal.backends import Marker
from backfill_portal.execution.executors.registry import register_executor
from backfill_portal.execution.executors.base import ExecutionContext


@register_executor("sql")
def execute_sql(ctx: ExecutionContext) -> Marker:
    return ctx.stage_select(ctx.render(ctx.definition["sql"]))
