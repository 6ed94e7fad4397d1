"""A catalog dataset as the warehouse backends see it."""
from __future__ import annotations

from backfill_portal.backends import ColumnSpec, DatasetSpec
from backfill_portal.catalog.choices import Grain
from backfill_portal.catalog.models import Dataset


def reader_layout_of(dataset: Dataset) -> str:
    """The catalog's reader layout, else "table" for an hourly dataset (8,760
    partitions a year: more than a partitioned table serves well, and each small
    enough to copy at its publish), else "" (the warehouse's default)."""
    return dataset.reader_layout or ("table" if dataset.grain == Grain.HOUR else "")


def spec_for(dataset: Dataset) -> DatasetSpec:
    return DatasetSpec(
        name=dataset.name,
        columns=tuple(ColumnSpec(name=c["name"], type=c["type"]) for c in dataset.columns),
        business_key=tuple(dataset.business_key),
        core_measure=dataset.core_measure or "",
        partition_column=dataset.partition_column or "",
        indexes=tuple(tuple(index) for index in dataset.indexes or ()),
        reader_layout=reader_layout_of(dataset),
    )
