"""The `side_effect` kind: deliver a notification about the upstream versions this run
pinned, once per (job, partition, upstream versions), and stage a row recording it."""
from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from backfill_portal.backends import Marker, WarehouseBackend
from backfill_portal.execution.executors.registry import register_executor
from backfill_portal.execution.executors.base import ExecutionContext, ExecutionError, PinnedInputs, reader
from backfill_portal.execution.models import Delivery, Run


@register_executor("side_effect")
def execute_side_effect(ctx: ExecutionContext) -> Marker:
    return ctx.stage_rows([deliver_side_effect(ctx.run, ctx.warehouse, ctx.pins, ctx.definition)])


def deliver_side_effect(run: Run, warehouse: WarehouseBackend, pins: PinnedInputs, definition: dict) -> tuple:
    """Deliver once per (job, partition, upstream version). The unique key on the
    outbox row makes a second delivery impossible, from any request or attempt."""
    effect = definition.get("side_effect", {})
    upstream_versions = sorted(f"{name}@{rid}" for name, parts in pins.versions.items() for rid in parts.values())
    if not upstream_versions:
        raise ExecutionError("nothing published upstream to notify about")
    key = f"{run.job.name}:{run.partition_key}:{'+'.join(upstream_versions)}"
    read = reader(warehouse, pins, run)
    summary: dict[str, Any] = {}
    for name in pins.versions:
        dataset = run.job.upstreams.get(name=name)
        rows = read(name)
        summary[name] = {"rows": len(rows)}
        if dataset.core_measure:
            summary[name][dataset.core_measure] = round(sum(float(r[dataset.core_measure] or 0) for r in rows), 2)
    message = f"{effect.get('subject') or run.job.name} {run.partition_key}: " + ", ".join(
        f"{n} {', '.join(f'{k}={v}' for k, v in s.items())}" for n, s in sorted(summary.items()))
    try:
        with transaction.atomic():
            Delivery.objects.create(job=run.job, run=run, partition_key=run.partition_key, idempotency_key=key,
                                    channel=effect.get("channel", "outbox"), delivered_at=timezone.now(),
                                    payload={"message": message, "summary": summary,
                                             "recipients": effect.get("recipients", [])})
    except IntegrityError:
        pass  # delivered already (another attempt or request): the constraint stopped the second one
    values = {"ds": run.partition_key, "partition": run.partition_key, "channel": effect.get("channel", "outbox"),
              "message": message, "idempotency_key": key}
    return tuple(values.get(c["name"]) for c in run.job.dataset.columns)
