"""The `dbt` kind: compile the frozen dbt model for the run's interval with dbt itself,
its `ref()` and `source()` bound to exactly what the run pinned, and stage the compiled
SELECT like any SQL job (same isolation, marker, checks, publication). dbt never writes
a table: it renders the model, the portal stages its rows into the run's version.

1. The project's manifest (dbt's parser, once per process), with the model as the code
   version froze it: raw SQL, upstreams, the SQL of its project macros.
2. Every upstream model and source renders as a placeholder relation; dbt compiles the
   model with the interval as vars (`data_interval_start`, `data_interval_end`,
   `partition_key`).
3. Each placeholder is bound to the run's pinned relation (`ctx.ref_sql`: the pinned
   versions of a model, the interval of a source) and the SELECT is staged.
"""
from __future__ import annotations

from backfill_portal.backends import Marker
from backfill_portal.catalog import dbt_project
from backfill_portal.execution.executors.base import ExecutionContext, ExecutionError
from backfill_portal.execution.executors.registry import register_executor


def compiled_select(ctx: ExecutionContext) -> str:
    """The SELECT the run stages: dbt's compile of the frozen model, bound to the pins."""
    if ctx.warehouse.dialect != "postgresql":
        raise ExecutionError(dbt_project.NO_ADAPTER)
    frozen = ctx.definition["dbt"]
    run = ctx.run
    variables = {"data_interval_start": run.data_interval_start.isoformat(),
                 "data_interval_end": run.data_interval_end.isoformat(), "partition_key": run.partition_key}
    try:
        manifest = dbt_project.project_manifest(frozen["project_dir"])
        missing = dbt_project.missing_for(manifest, frozen)
        if missing:
            raise ExecutionError(f"dbt model {frozen['model']}: the project at {frozen['project_dir']} no longer has "
                                 f"{', '.join(missing)}, which its frozen code version uses; sync_dbt and file a "
                                 "new request")
        with dbt_project.patched(manifest, frozen.get("upstreams") or {}, frozen=frozen):
            compiled = dbt_project.compile_nodes(manifest, frozen["project_dir"], [frozen["model"]],
                                                 variables=variables)[frozen["model"]]
        relations = {name: ctx.ref_sql(name) for name in dbt_project.placeholders_in(compiled)}
        return dbt_project.bind(compiled, relations)
    except dbt_project.DbtError as exc:
        raise ExecutionError(f"dbt model {frozen['model']}: {exc}") from None


@register_executor("dbt")
def execute_dbt(ctx: ExecutionContext) -> Marker:
    return ctx.stage_select(compiled_select(ctx))
