"""The process's warehouse: the adapter for WAREHOUSE_URL and dataset specs from the catalog."""
from __future__ import annotations

import threading

from backfill_portal.catalog.models import Dataset
from backfill_portal.warehouse.adapter import ColumnSpec, DatasetSpec, Warehouse
from backfill_portal.warehouse.db import get_warehouse_db

_warehouses: dict[str, Warehouse] = {}
_lock = threading.Lock()


def get_warehouse(url: str | None = None) -> Warehouse:
    """One adapter per warehouse per process: it remembers which tables it has
    ensured, so a task does not look the schema up again on every call."""
    db = get_warehouse_db(url)
    warehouse = _warehouses.get(db.url)
    if warehouse is None:
        with _lock:
            warehouse = _warehouses.get(db.url)
            if warehouse is None:
                warehouse = Warehouse(db)
                warehouse.ensure_meta()
                _warehouses[db.url] = warehouse
    return warehouse


def spec_for(dataset: Dataset) -> DatasetSpec:
    return DatasetSpec(
        name=dataset.name,
        columns=tuple(ColumnSpec(name=c["name"], type=c["type"]) for c in dataset.columns),
        business_key=tuple(dataset.business_key),
        core_measure=dataset.core_measure or "",
    )


def reset_warehouse_cache() -> None:
    """Tests point WAREHOUSE_URL at a fresh database."""
    _warehouses.clear()
