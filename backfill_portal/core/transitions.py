"""The one mechanism every state change goes through.

Each stateful model has a `transitions.py` with its allowed-edges map; its transition
functions call `apply_transition`, which checks the edge, claims the row with a
conditional update (a count other than 1 is a lost race), and writes the audit row,
all in one transaction.
"""
from __future__ import annotations

from collections.abc import Mapping

from django.db import models, transaction

from backfill_portal.core.errors import ConflictError
from backfill_portal.core.rows import update_row
from backfill_portal.core.services.audit import audit_record


def apply_transition(
    *,
    instance: models.Model,
    to: str,
    edges: Mapping[str, frozenset[str] | set[str] | tuple[str, ...]],
    actor,
    object_type: str,
    request_id: int | None = None,
    dataset: str = "",
    reason: str = "",
    updates: dict | None = None,
    data: dict | None = None,
    action: str | None = None,
    expect: dict | None = None,
) -> models.Model:
    """`expect`: other columns the row must still hold for the claim to win (a fencing
    token: a reclaimed worker's late transition finds it changed and is refused)."""
    current = instance.status
    if to not in edges.get(current, ()):
        raise ConflictError(
            f"{object_type} {instance.pk} is {current}; it cannot become {to}",
            field="status",
        )
    updates = dict(updates or {})
    # No savepoint: inside a caller's transaction this is part of its unit of work (an
    # error here must roll all of it back), and a lost race changes nothing, so it is
    # raised after the block and a caller may catch it and go on. A savepoint would add
    # a SAVEPOINT and a RELEASE to every transition and its audit row.
    with transaction.atomic(savepoint=False):
        # One fixed statement per model and set of columns: a backfill interval makes
        # several transitions, and the ORM would compile the same UPDATE for each.
        claimed = update_row(type(instance), instance.pk, {"status": to, **updates}, where={**(expect or {}), "status": current})
        if claimed == 1:
            audit_record(
                actor=actor,
                action=action or f"{object_type}.{to}",
                object_type=object_type,
                object_id=instance.pk,
                request_id=request_id,
                dataset=dataset,
                from_state=current,
                to_state=to,
                reason=reason,
                data=data,
            )
    if claimed != 1:
        raise ConflictError(
            f"{object_type} {instance.pk} changed while we were working on it; reload and try again",
            field="status",
        )
    instance.status = to
    for key, value in updates.items():
        setattr(instance, key, value)
    return instance
