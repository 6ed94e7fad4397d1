from __future__ import annotations

from django.db.models import QuerySet

from backfill_portal.catalog.models import Dataset, Job


def dataset_list() -> QuerySet[Dataset]:
    return Dataset.objects.select_related("owner", "team").prefetch_related("job")


def job_list() -> QuerySet[Job]:
    return Job.objects.select_related("dataset__owner", "dataset__team", "pool", "current_code_version").prefetch_related("upstreams")


LINEAGE_PARTITIONS_INLINE = 500


def lineage_expand(*, root: str, start: str | None = None, end: str | None = None) -> dict:
    """The closure of `root` for the API and the preview; partitions when a range is given."""
    from backfill_portal.catalog.calendar import plan_intervals
    from backfill_portal.catalog.lineage import LineageGraph
    from backfill_portal.core.errors import NotFound, ValidationError

    job = Job.objects.select_related("dataset").filter(name=root).first()
    if job is None:
        raise NotFound(f"job {root!r} does not exist")
    try:
        graph = LineageGraph.cached()
        if start and end:
            planned = plan_intervals(grain=job.dataset.grain, timezone=job.dataset.timezone, first=start, last=end,
                                     limit=None)
            nodes = graph.expand(root, planned[0].start, planned[-1].end)
        elif start or end:
            raise ValidationError("give both start and end, or neither", field="end" if start else "start")
        else:
            nodes = graph.closure(root)
    except ValueError as exc:
        raise ValidationError(str(exc), field="root") from None
    return {"root": root, "nodes": [{
        "job": n.job.name, "dataset": n.job.dataset, "kind": n.job.kind, "owner": n.job.owner, "layer": n.layer,
        "side_effect": n.is_side_effect, "depends_on_past": n.job.depends_on_past, "upstream_jobs": n.upstream_jobs,
        "grain": n.job.grain, "timezone": n.job.timezone, "partition_count": len(n.partitions),
        "partitions": n.partitions[:LINEAGE_PARTITIONS_INLINE],
    } for n in nodes]}
