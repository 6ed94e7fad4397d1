"""Celery tasks of the core app: take nothing, call one service. Safe to run twice."""
from __future__ import annotations

import logging

from celery import shared_task

from backfill_portal.core.services.audit import AuditChainBroken, audit_anchor

logger = logging.getLogger(__name__)


@shared_task(name="core.anchor_audit")
def anchor_audit() -> dict:
    """The scheduler's periodic `manage.py anchor_audit`. A chain that does not verify
    is not anchored; the error goes to the log for whoever watches it."""
    try:
        anchor, appended = audit_anchor(actor=None)
    except AuditChainBroken as exc:
        logger.error("audit log not anchored: %s", exc)
        raise
    return {"last_id": anchor.last_id, "count": anchor.count, "appended": appended}
