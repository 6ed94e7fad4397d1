"""The one mechanism every state change goes through.

Each stateful model has a `transitions.py` with its allowed-edges map; its transition
functions call `apply_transition`, which checks the edge, claims the row with a
conditional update (a count other than 1 is a lost race), and writes the audit row,
all in one transaction.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from django.db import models, transaction
from django.db.models import Case, Q, Value, When

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
            f"{object_type} {instance.pk} is already {to}" if current == to  # a second click
            else f"{object_type} {instance.pk} is {current}; it cannot become {to}",
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


def apply_transitions(
    *,
    instances: Sequence[models.Model],
    to: str,
    edges: Mapping[str, frozenset[str] | set[str] | tuple[str, ...]],
    actor,
    object_type: str,
    audit: Callable[[models.Model], dict],
    updates: dict | None = None,
    expect: Callable[[models.Model], dict] | None = None,
) -> None:
    """`apply_transition` for several rows of one model in one state: one conditional
    UPDATE claims them all, and each gets the audit row it would get alone (`audit(row)`:
    its request_id, dataset, reason and data). All or nothing: if any row moved on (a
    count other than len(instances)), ConflictError is raised and the caller's savepoint
    rolls back the whole set (the caller's transaction is marked for rollback when some
rows were claimed; when none was, nothing changed and it stays usable).

    `updates`: column -> value, or a callable giving each row its own value (written by
    one CASE on the primary key). `expect(row)`: the columns that row must still hold."""
    if not instances:
        return
    model = type(instances[0])
    current = instances[0].status
    if any(instance.status != current for instance in instances) or to not in edges.get(current, ()):
        raise ConflictError(f"{object_type}s in {sorted({i.status for i in instances})} cannot all become {to}",
                            field="status")
    values = {name: {i.pk: value(i) for i in instances} if callable(value) else value
              for name, value in (updates or {}).items()}
    sql_values = {name: _one_or_case(model, name, value) if isinstance(value, dict) else value
                  for name, value in values.items()}
    expected = [expect(instance) for instance in instances] if expect is not None else []
    if all(each == expected[0] for each in expected[1:]):
        # Every row expects the same (or nothing): one IN list, not an OR a row.
        claimed_rows = model._base_manager.filter(pk__in=[i.pk for i in instances], status=current,
                                                  **(expected[0] if expected else {}))
    else:
        condition = Q()
        for instance, each in zip(instances, expected):
            condition |= Q(pk=instance.pk, **each)
        claimed_rows = model._base_manager.filter(condition, status=current)
    lost = ConflictError(f"{object_type}s changed while we were working on them; reload and try again",
                         field="status")
    with transaction.atomic(savepoint=False):
        claimed = claimed_rows.update(status=to, **sql_values)
        if 0 < claimed < len(instances):
            raise lost  # inside the block: the caller's transaction (or savepoint) must roll back
        for instance in instances if claimed else ():
            audit_record(actor=actor, action=f"{object_type}.{to}", object_type=object_type,
                         object_id=instance.pk, from_state=current, to_state=to, **audit(instance))
    if not claimed:
        raise lost  # nothing changed: the transaction stays usable
    for instance in instances:
        instance.status = to
        for name, value in values.items():
            setattr(instance, name, value[instance.pk] if isinstance(value, dict) else value)


def _one_or_case(model: type[models.Model], name: str, by_pk: dict):
    """Each row's own value of `name`: one value when they all have the same (a
    bundle's runs started at one instant), else one CASE on the primary key."""
    first, *rest = by_pk.values()
    if all(value == first for value in rest):
        return first  # as a value given for all rows is written
    field = model._meta.get_field(name)
    return Case(*(When(pk=pk, then=Value(v, output_field=field)) for pk, v in by_pk.items()), output_field=field)
