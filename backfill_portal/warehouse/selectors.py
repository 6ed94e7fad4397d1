from __future__ import annotations

from backfill_portal.catalog.models import Dataset
from backfill_portal.core.errors import NotFound
from backfill_portal.warehouse.models import Contamination, Publication, Version
from backfill_portal.backends import get_warehouse


def partition_state(*, dataset_name: str, partition_key: str) -> dict:
    """The current pointer (read from the warehouse, the truth) and the history."""
    dataset = Dataset.objects.filter(name=dataset_name).first()
    if dataset is None:
        raise NotFound(f"dataset {dataset_name!r} does not exist")
    partition_key = canonical_partition_key(dataset, partition_key)
    current = None if dataset.is_source else get_warehouse().current(dataset.name, partition_key)
    publications = list(Publication.objects.filter(dataset=dataset, partition_key=partition_key)
                        .select_related("version__run", "previous_version__run", "actor", "dataset"))
    versions = list(Version.objects.filter(dataset=dataset, partition_key=partition_key)
                    .select_related("run", "dataset").order_by("-id"))
    if not publications and not versions and current is None:
        raise NotFound(f"{dataset_name} has no version of partition {partition_key}")
    return {"dataset": dataset, "partition_key": partition_key, "current_run_id": current,
            "publications": publications, "versions": versions}


def canonical_partition_key(dataset: Dataset, key: str) -> str:
    """`key` as the catalog writes it: an hour given in UTC (`2026-12-07T11:00Z`) or with
    seconds (`06:00:00-05:00`), as a request's bounds may be, is the partition
    `2026-12-07T06:00-05:00` of a New York dataset. `key` itself when it names no
    partition of the dataset (the lookup then finds nothing: a 404)."""
    from backfill_portal.catalog.calendar import parse_partition, partition_for
    from backfill_portal.core.errors import ValidationError

    try:
        local = parse_partition(grain=dataset.grain, timezone=dataset.timezone, value=key, field="partition")
        return partition_for(grain=dataset.grain, timezone=dataset.timezone, at=local).partition_key
    except (ValidationError, ValueError, OverflowError):
        return key


def built_on_a_replaced_past(dataset: Dataset, current: dict[str, str]) -> dict[str, dict]:
    """For a depends_on_past dataset, the partitions among `current` ({key: run_id readers
    see}) built on a past readers no longer see.

    - Directly: its version read a previous partition that a later request republished,
      and the rebuild of what came after was cancelled or excluded.
      {key: {"previous": key, "read": run_id, "now": run_id or None}}
    - Through the chain: a partition before it is stale directly, and nothing rebuilt from
      there since, so its running state descends from that stale one (`through`: the
      nearest such partition, in `current` or before it).
      {key: {"through": key, "previous": ..., "read": ..., "now": ...}} (the root's read).

    The roots are looked for among all the dataset's published partitions up to the last
    of `current`: a few queries and two warehouse reads, whatever the number of
    partitions."""
    from backfill_portal.catalog.models import Job

    if dataset.is_source or not current or not Job.objects.filter(dataset=dataset, depends_on_past=True).exists():
        return {}
    first, last = min(current), max(current)
    roots = _roots_before(dataset, first)
    roots.update(_read_a_replaced_past(dataset, current))
    out, carried = {}, None
    for key in sorted(set(current) | set(roots)):
        if key > last:
            break
        if key in roots:
            carried = key
            if key in current:
                out[key] = roots[key]
        elif carried is not None and key in current and current[key]:
            out[key] = {"through": carried, **roots[carried]}
    return out


def _roots_before(dataset: Dataset, first: str) -> dict[str, dict]:
    """`_read_a_replaced_past` for the partitions before `first`, from the publication
    history (the metadata's mirror of the pointers): two queries, no list of keys."""
    from django.db.models import Max

    from backfill_portal.warehouse.models import Consumption

    newest = (Publication.objects.filter(dataset=dataset, partition_key__lt=first).values("partition_key")
              .annotate(last=Max("id")).values("last"))
    now = {key: (version_id, run_id) for key, version_id, run_id in Publication.objects.filter(pk__in=newest)
           .values_list("partition_key", "version_id", "version__run__run_id")}
    runs = {run_id: key for key, (_, run_id) in now.items()}
    out = {}
    for run_id, previous, read_version, read in (
            Consumption.objects.filter(dataset=dataset, partition_key__lt=first, run__job__dataset=dataset)
            .values_list("run__run_id", "partition_key", "version_id", "version__run__run_id")):
        if run_id in runs and read_version and now.get(previous, (None,))[0] != read_version:
            out[runs[run_id]] = {"previous": previous, "read": read, "now": now.get(previous, (None, None))[1]}
    return out


def _read_a_replaced_past(dataset: Dataset, current: dict[str, str]) -> dict[str, dict]:
    """The partitions among `current` whose version read a previous partition whose
    version readers no longer see."""
    from backfill_portal.warehouse.models import Consumption

    by_run = {run_id: key for key, run_id in current.items() if run_id}
    if not by_run:
        return {}
    reads = list(Consumption.objects.filter(run__run_id__in=list(by_run), dataset=dataset)
                 .values_list("run__run_id", "partition_key", "version__run__run_id"))
    now = get_warehouse().current_many(dataset.name, sorted({previous for _, previous, _ in reads}))
    out = {}
    for run_id, previous, read in reads:
        if read and now.get(previous) != read:
            out[by_run[run_id]] = {"previous": previous, "read": read, "now": now.get(previous)}
    return out


def publications_in_effect(rows: list[Contamination]) -> dict[tuple[int, str], Publication]:
    """The publication in effect for each (dataset, partition) of `rows`."""
    pairs = {(r.dataset_id, r.partition_key) for r in rows}
    found: dict[tuple[int, str], Publication] = {}
    keys = sorted({k for _, k in pairs})
    for pub in (Publication.objects.filter(dataset_id__in={d for d, _ in pairs}, partition_key__in=keys)
                .select_related("version__run").order_by("id")):
        if (pub.dataset_id, pub.partition_key) in pairs:
            found[(pub.dataset_id, pub.partition_key)] = pub
    return found


def contamination_status(row: Contamination, current: Publication | None) -> dict:
    """Where one closure entry stands: `pending` while readers still see the version
    built from the rolled-back input, `rebuilt` once a version published after the
    rollback replaced it, `withdrawn` when the pointer went back instead."""
    base = "built from a rolled-back input"
    rebuild = row.rebuild
    if current is not None and current.version_id == row.version_id:
        message = f"{base}: rebuild pending"
        if rebuild is not None:
            message += f" (#{rebuild.pk}, {rebuild.status})"
        return {"state": "pending", "rebuilt_by": None, "message": message}
    if current is not None and current.action == Publication.Action.PUBLISH and current.published_at >= row.found_at:
        by = current.request_id
        return {"state": "rebuilt", "rebuilt_by": by,
                "message": f"{base}: rebuilt by #{by}" if by else f"{base}: rebuilt by run {current.version.run.run_id}"}
    now = current.version.run.run_id if current is not None else "nothing"
    return {"state": "withdrawn", "rebuilt_by": None, "message": f"{base}: no longer current (readers see {now})"}
