"""Warehouse outages: a failure that a fresh connection confirms opens one; the
periodic probe closes it. The execution layer reads `warehouse_outage_current()` to
hold its work and re-sends that work when a probe closes the outage."""
from __future__ import annotations

import logging

from django.db import IntegrityError, transaction
from django.utils import timezone

from backfill_portal.backends import WarehouseUnavailable, probe_warehouse
from backfill_portal.core.errors import ConflictError
from backfill_portal.core.services.audit import audit_record
from backfill_portal.warehouse.models import WarehouseOutage
from backfill_portal.warehouse.transitions import outage_transition

logger = logging.getLogger(__name__)
OPEN, CLOSED = WarehouseOutage.Status.OPEN, WarehouseOutage.Status.CLOSED


def warehouse_outage_current() -> WarehouseOutage | None:
    """The open outage, if any (one indexed row at most)."""
    return WarehouseOutage.objects.filter(status=OPEN).order_by().first()


def warehouse_outage_open(*, error: str) -> WarehouseOutage:
    """Record that the warehouse refuses connections; an outage already open is kept
    (two workers that notice together record one)."""
    current = warehouse_outage_current()
    if current is not None:
        return current
    now = timezone.now()
    try:
        with transaction.atomic():
            outage = WarehouseOutage.objects.create(status=OPEN, started_at=now, last_probe_at=now, probes=1,
                                                    error=error[:2000])
            audit_record(actor=None, action="warehouse.unreachable", object_type="warehouse_outage",
                         object_id=outage.pk, to_state=OPEN, reason=error[:500],
                         data={"started_at": now.isoformat()})
    except IntegrityError:  # another process opened it first
        current = warehouse_outage_current()
        if current is None:
            raise
        return current
    logger.warning("warehouse unreachable: %s; holding attempts and dispatch until a probe succeeds", error)
    return outage


def warehouse_outage_confirm(*, error: str) -> WarehouseOutage | None:
    """After a failure that may be the warehouse's own: try a fresh connection. If it is
    refused too, the warehouse is down: open (or keep) the outage and return it. If it
    succeeds, the failure was the work's own: None."""
    try:
        probe_warehouse()
    except WarehouseUnavailable as exc:
        return warehouse_outage_open(error=f"{error[:1000]} (probe: {exc})")
    return None


def warehouse_outage_probe() -> WarehouseOutage | None:
    """With an outage open, try a fresh connection: on success close the outage and
    return it (the caller resumes the held work); on failure count the probe. None
    when no outage is open or the warehouse still refuses."""
    outage = warehouse_outage_current()
    if outage is None:
        return None
    now = timezone.now()
    try:
        probe_warehouse()
    except WarehouseUnavailable as exc:
        WarehouseOutage.objects.filter(pk=outage.pk, status=OPEN).update(
            last_probe_at=now, probes=outage.probes + 1, error=str(exc)[:2000])
        return None
    seconds = round((now - outage.started_at).total_seconds(), 1)
    try:
        with transaction.atomic():
            outage_transition(outage, to=CLOSED, reason=f"a probe connected after {seconds} s",
                              updates={"ended_at": now, "last_probe_at": now, "probes": outage.probes + 1},
                              data={"started_at": outage.started_at.isoformat(), "seconds": seconds})
    except ConflictError:  # a concurrent probe closed it first and resumes the work
        return None
    logger.info("warehouse reachable again after %s s; resuming", seconds)
    return outage
