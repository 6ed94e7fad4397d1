from __future__ import annotations

from backfill_portal.catalog.models import Dataset
from backfill_portal.core.errors import NotFound
from backfill_portal.warehouse.models import Publication, Version
from backfill_portal.backends import get_warehouse


def partition_state(*, dataset_name: str, partition_key: str) -> dict:
    """The current pointer (read from the warehouse, the truth) and the history."""
    dataset = Dataset.objects.filter(name=dataset_name).first()
    if dataset is None:
        raise NotFound(f"dataset {dataset_name!r} does not exist")
    current = None if dataset.is_source else get_warehouse().current(dataset.name, partition_key)
    publications = list(Publication.objects.filter(dataset=dataset, partition_key=partition_key)
                        .select_related("version__run", "previous_version__run", "actor", "dataset"))
    versions = list(Version.objects.filter(dataset=dataset, partition_key=partition_key)
                    .select_related("run", "dataset").order_by("-id"))
    if not publications and not versions and current is None:
        raise NotFound(f"{dataset_name} has no version of partition {partition_key}")
    return {"dataset": dataset, "partition_key": partition_key, "current_run_id": current,
            "publications": publications, "versions": versions}
