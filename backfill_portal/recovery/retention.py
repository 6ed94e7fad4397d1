"""Retention: purge old versions' rows, keep everything a reader or a rollback needs.

A version older than the window (settings.VERSION_RETENTION_DAYS, by commit time) is
purged through `Warehouse.purge` unless it is:

- the current version of its partition (the warehouse refuses that too);
- the previous verified version of its partition (what a rollback would restore);
- pinned by a run still in flight (it is reading it), or the output of such a run;
- rolled back less than a window ago (kept for diagnosis);
- already purged.

Each purge sets Version.purged_at and writes an audit row. What writers that died
before their commit marker left (a files layout's run directories) is swept too
(`warehouse_orphans_sweep`). Safe to run twice: the
warehouse step deletes nothing the second time and the mirror is a conditional update.

OpenLineage events (`LineageEvent`) delivered more than LINEAGE_EVENT_RETENTION_DAYS
ago are deleted too (`lineage_events_purge_expired`), each batch with its audit row;
an event not yet delivered is never deleted, nor any event of a run still in flight.
"""
from __future__ import annotations

import logging
from collections import defaultdict
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from backfill_portal.backends import PurgeRefused, get_warehouse
from backfill_portal.catalog.models import Dataset
from backfill_portal.catalog.specs import spec_for
from backfill_portal.core.services.audit import audit_record
from backfill_portal.execution.lineage_out.outbox import lineage_events_purge_delivered
from backfill_portal.execution.queue import outbox_purge
from backfill_portal.execution.transitions import RUN_ACTIVE
from backfill_portal.recovery.rollback import previous_verified
from backfill_portal.warehouse.models import Consumption, Publication, Version

logger = logging.getLogger(__name__)


def _protected(dataset: Dataset, partitions: list[str], *, cutoff) -> set[int]:
    """Version ids of `dataset` in `partitions` that must stay, per the module docstring."""
    keep: set[int] = set()
    current = get_warehouse().current_many(dataset.name, partitions)
    history: dict[str, list[Publication]] = defaultdict(list)
    for i in range(0, len(partitions), 500):
        for pub in (Publication.objects.filter(dataset=dataset, partition_key__in=partitions[i:i + 500])
                    .select_related("version__run", "previous_version__run").order_by("-id")):
            history[pub.partition_key].append(pub)
    for partition in partitions:
        pubs = history.get(partition, [])
        run_id = current.get(partition)
        if run_id:
            keep.update(p.version_id for p in pubs if p.version.run.run_id == run_id)
            previous = previous_verified(pubs, run_id)
            if previous is not None:
                keep.add(previous.pk)
        for pub in pubs:
            if pub.action == Publication.Action.ROLLBACK and pub.published_at >= cutoff and pub.previous_version_id:
                keep.add(pub.previous_version_id)
    return keep


def versions_purge_expired(*, actor=None, now=None, days: int | None = None) -> dict:
    """Purge the versions older than the retention window. Returns counts."""
    days = settings.VERSION_RETENTION_DAYS if days is None else days
    now = now or timezone.now()
    cutoff = now - timedelta(days=days)
    warehouse = get_warehouse()
    in_flight = set(Consumption.objects.filter(run__status__in=RUN_ACTIVE, version__isnull=False)
                    .values_list("version_id", flat=True))
    in_flight |= set(Version.objects.filter(run__status__in=RUN_ACTIVE).values_list("id", flat=True))
    purged = kept = rows = 0
    old = (Version.objects.filter(purged_at__isnull=True, committed_at__lt=cutoff)
           .select_related("run", "dataset").order_by("dataset_id", "partition_key", "id"))
    by_dataset: dict[int, list[Version]] = defaultdict(list)
    for version in old:
        by_dataset[version.dataset_id].append(version)
    for versions in by_dataset.values():
        dataset = versions[0].dataset
        keep = _protected(dataset, sorted({v.partition_key for v in versions}), cutoff=cutoff) | in_flight
        spec = spec_for(dataset)
        for version in versions:
            if version.pk in keep:
                kept += 1
                continue
            try:
                deleted = warehouse.purge(spec=spec, run_id=version.run.run_id)
            except PurgeRefused as exc:  # it became current since we looked: keep it
                logger.info("purge refused: %s", exc)
                kept += 1
                continue
            with transaction.atomic():
                if Version.objects.filter(pk=version.pk, purged_at__isnull=True).update(purged_at=now) != 1:
                    continue
                audit_record(actor=actor, action="version.purge", object_type="version", object_id=version.pk,
                             request_id=version.run.request_id, dataset=dataset.name,
                             reason=f"older than the {days}-day retention window",
                             data={"run_id": version.run.run_id, "partition": version.partition_key,
                                   "rows": deleted, "committed_at": version.committed_at})
            purged += 1
            rows += deleted
    if purged:
        logger.info("retention purged %d version(s), %d row(s); kept %d", purged, rows, kept)
    return {"purged": purged, "rows": rows, "kept": kept, "cutoff": cutoff.isoformat()}


def warehouse_orphans_sweep(*, actor=None) -> dict:
    """Delete what dead writers left in the warehouse (`sweep_orphans`, per produced
    dataset: an Iceberg run directory without a marker whose writer's lock or lease is
    gone), one audit row per dataset that had any. Returns counts."""
    warehouse = get_warehouse()
    files = datasets = 0
    for dataset in Dataset.objects.filter(is_source=False).order_by("name"):
        deleted = warehouse.sweep_orphans(dataset.name)
        if not deleted:
            continue
        with transaction.atomic():
            audit_record(actor=actor, action="warehouse.orphans_swept", object_type="dataset",
                         object_id=dataset.pk, dataset=dataset.name,
                         reason="files of writers that died before their commit marker",
                         data={"files": len(deleted), "first": deleted[:5]})
        logger.info("retention swept %d orphaned file(s) of %s", len(deleted), dataset.name)
        files += len(deleted)
        datasets += 1
    return {"files": files, "datasets": datasets}


def lineage_events_purge_expired(*, actor=None, now=None, days: int | None = None) -> dict:
    """Delete the OpenLineage events delivered more than `days` ago
    (settings.LINEAGE_EVENT_RETENTION_DAYS). Returns counts."""
    days = settings.LINEAGE_EVENT_RETENTION_DAYS if days is None else days
    cutoff = (now or timezone.now()) - timedelta(days=days)
    purged = lineage_events_purge_delivered(sent_before=cutoff, keep_runs_in=RUN_ACTIVE, actor=actor,
                                            reason=f"delivered before the {days}-day retention window")
    if purged:
        logger.info("retention purged %d delivered lineage event(s)", purged)
    return {"purged": purged, "cutoff": cutoff.isoformat()}


def task_outbox_purge_expired(*, actor=None, now=None, days: int | None = None) -> dict:
    """Delete the task outbox rows sent more than `days` ago
    (settings.TASK_OUTBOX_RETENTION_DAYS); never a row not yet sent. Returns counts."""
    days = settings.TASK_OUTBOX_RETENTION_DAYS if days is None else days
    cutoff = (now or timezone.now()) - timedelta(days=days)
    purged = outbox_purge(sent_before=cutoff, actor=actor, reason=f"sent before the {days}-day retention window")
    if purged:
        logger.info("retention purged %d sent task outbox row(s)", purged)
    return {"purged": purged, "cutoff": cutoff.isoformat()}
