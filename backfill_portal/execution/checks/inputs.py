"""No pinned input was rolled back, or built from a rolled-back one."""
from __future__ import annotations

from django.db.models import Q

from backfill_portal.execution.checks.registry import register_check
from backfill_portal.execution.checks.base import Check, CheckContext, VerificationCheck
from backfill_portal.execution.choices import RunStatus as S
from backfill_portal.execution.executors.base import upstreams_of
from backfill_portal.execution.models import Run
from backfill_portal.warehouse.models import Consumption


@register_check
class InputsNotRolledBack(VerificationCheck):
    name = "inputs_not_rolled_back"
    order = 600

    def run(self, ctx: CheckContext):
        yield inputs_not_rolled_back(ctx.run)


def inputs_not_rolled_back(run: Run) -> Check:
    """Blocking: none of the versions this run pinned was rolled back, or was built from
    one (an entry of a rollback's contaminated closure). A run that pinned its inputs
    before a rollback, or read a partition still waiting for its rebuild, would
    otherwise publish numbers from the bad version that no closure names. One query,
    and none for a job that pins no version (it reads sources only, not its own past)."""
    if run.job.depends_on_past or any(not dataset.is_source for dataset in upstreams_of(run.job)):
        bad = _rolled_back_inputs(run)
    else:
        bad = []
    shown = [f"{ds}/{part} {run_id} ({'rolled back' if status == S.ROLLED_BACK else 'built from a rolled-back input'})"
             for ds, part, run_id, status in bad]
    return Check(InputsNotRolledBack.name, not bad, observed={"inputs": shown},
                 message="" if not bad else "read " + "; ".join(shown) + ": rerun it on the restored (or rebuilt) inputs")


def _rolled_back_inputs(run: Run) -> list[tuple]:
    return list(Consumption.objects.filter(run=run, version__isnull=False).filter(
        Q(version__run__status=S.ROLLED_BACK) | Q(version__contaminations__isnull=False))
        .values_list("dataset__name", "partition_key", "version__run__run_id", "version__run__status")
        .distinct().order_by("dataset__name", "partition_key")[:20])
