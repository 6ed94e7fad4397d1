"""Allowed edges of a warehouse outage. No other code assigns `.status`."""
from __future__ import annotations

from backfill_portal.core.transitions import apply_transition
from backfill_portal.warehouse.models import WarehouseOutage

O = WarehouseOutage.Status
OUTAGE_EDGES: dict[str, frozenset[str]] = {
    O.OPEN: frozenset({O.CLOSED}),
    O.CLOSED: frozenset(),
}


def outage_transition(outage: WarehouseOutage, *, to: str, reason: str = "", updates: dict | None = None,
                      data: dict | None = None) -> WarehouseOutage:
    return apply_transition(instance=outage, to=to, edges=OUTAGE_EDGES, actor=None, object_type="warehouse_outage",
                            reason=reason, updates=updates, data=data)
