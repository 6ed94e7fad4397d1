"""Roles are Django groups; dataset ownership is per object (Dataset.owner).

Checks live in the services, so the web views, the API and the CLI are equally
protected. A refusal is written to the audit log in its own transaction (the action
it refused never happened, so there is nothing to roll back with it) and raised as
PermissionDenied (HTTP 403).
"""
from __future__ import annotations

from django.db import models, transaction

from backfill_portal.core.errors import PermissionDenied
from backfill_portal.core.services.audit import audit_record


class Role(models.TextChoices):
    REQUESTER = "requester"
    OWNER = "owner"
    ONCALL = "oncall"
    AUDITOR = "auditor"
    ADMIN = "admin"


def user_roles(user) -> set[str]:
    if user is None or not getattr(user, "is_authenticated", False):
        return set()
    cached = getattr(user, "_bp_roles", None)
    if cached is None:
        cached = set(user.groups.values_list("name", flat=True)) & set(Role.values)
        if user.is_superuser:
            cached.add(Role.ADMIN)
        user._bp_roles = cached
    return cached


def stand_in_with_roles(user, roles: set[str]):
    """`user` (an unsaved stand-in, for compiling a statement once for every user of
    these roles) taken to have exactly `roles`, without reading any group."""
    user._bp_roles = set(roles) & set(Role.values)
    return user


def has_role(user, *roles: str) -> bool:
    return bool(user_roles(user) & set(roles))


def deny(*, actor, action: str, reason: str, object_type: str = "", object_id="", request_id: int | None = None,
         dataset: str = "") -> PermissionDenied:
    """Record the refusal and return the exception for the caller to raise."""
    with transaction.atomic():
        audit_record(
            actor=actor, action="denied." + action, object_type=object_type or "permission",
            object_id=object_id or "-", request_id=request_id, dataset=dataset, reason=reason,
        )
    return PermissionDenied(reason)


def require_role(actor, *roles: str, action: str, request_id: int | None = None, object_type: str = "", object_id="") -> None:
    if not has_role(actor, *roles):
        needed = " or ".join(roles)
        raise deny(actor=actor, action=action, reason=f"{action} needs the {needed} role",
                   request_id=request_id, object_type=object_type, object_id=object_id)
