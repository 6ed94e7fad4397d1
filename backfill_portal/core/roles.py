"""Roles are Django groups; dataset ownership is per object (Dataset.owner).

Checks live in the services, so the web views, the API and the CLI are equally
protected. A refusal is written to the audit log in its own transaction (the action
it refused never happened, so there is nothing to roll back with it) and raised as
PermissionDenied (HTTP 403).
"""
from __future__ import annotations

from django.contrib.auth import get_user_model
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
        cached = set(roles_of(user.groups.values_list("name", flat=True), is_superuser=user.is_superuser))
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
    refusal = PermissionDenied(reason)
    refusal.audited = True  # the error page says so only then (a page's GET refusal is not recorded)
    return refusal


def require_role(actor, *roles: str, action: str, request_id: int | None = None, object_type: str = "", object_id="") -> None:
    if not has_role(actor, *roles):
        needed = " or ".join(roles)
        raise deny(actor=actor, action=action, reason=f"{action} needs the {needed} role",
                   request_id=request_id, object_type=object_type, object_id=object_id)


# --- Audit rows of a change of roles (written by the receivers of core/role_audit.py: the
# admin and the ORM change roles without passing a service), in the change's transaction.

FLAGS = ("is_superuser", "is_staff", "is_active")


def roles_of(group_names, *, is_superuser: bool) -> list[str]:
    """The roles a user with these groups and this flag has: its groups that are roles,
    and admin for a superuser (what `user_roles` reads, and what a role change's audit
    row records before and after)."""
    roles = set(group_names) & set(Role.values)
    if is_superuser:
        roles.add(Role.ADMIN)
    return sorted(roles)


def user_groups_change_record(*, actor, before: dict, after: dict, group_deleted: str = "") -> None:
    """One `user.roles` row: the user's groups before and after one change of them
    (`{"pk", "username", "is_superuser", "groups"}`), with the roles they amount to.
    Nothing when the groups did not change. `group_deleted`: the change is the deletion
    of that group (its memberships went with it)."""
    added, removed = sorted(after["groups"] - before["groups"]), sorted(before["groups"] - after["groups"])
    if not added and not removed:
        return
    said = "; ".join(part for part in (added and "added to " + ", ".join(added),
                                       removed and "removed from " + ", ".join(removed)) if part)
    data = {"username": after["username"],
            "roles_before": roles_of(before["groups"], is_superuser=before["is_superuser"]),
            "roles_after": roles_of(after["groups"], is_superuser=after["is_superuser"]),
            "groups_added": added, "groups_removed": removed}
    if group_deleted:
        said += f" (the group {group_deleted} was deleted)"
        data["group_deleted"] = group_deleted
    audit_record(actor=actor, action="user.roles", object_type="user", object_id=after["pk"],
                 reason=f"{after['username']}: {said}", data=data)


def group_delete_record(*, actor, group: str, members: dict[int, dict]) -> None:
    """One `user.roles` row per member of a deleted group that is a role, each losing
    it (`members`: their state before, as for `user_groups_change_record`). Nothing for
    a group that is not a role: nobody's roles change."""
    if group not in Role.values:
        return
    for user_id in sorted(members):
        before = members[user_id]
        user_groups_change_record(actor=actor, before=before, after={**before, "groups": before["groups"] - {group}},
                                  group_deleted=group)


def user_delete_record(*, actor, before: dict) -> None:
    """One `user.roles` row for a user deleted while holding roles (`before` as for
    `user_groups_change_record`): every role goes. Nothing for a user without roles.

    Written after the user's row is deleted, in the deletion's transaction. An actor
    whose own row is gone by then (an admin deleting their own account, alone or among
    others) is recorded by name only (`actor_name`, no `actor_id`): a row pointing at
    the deleted user would break its foreign key, and the deletion would fail at commit."""
    roles = roles_of(before["groups"], is_superuser=before["is_superuser"])
    if not roles:
        return
    data = {"username": before["username"], "deleted": True, "roles_before": roles, "roles_after": [],
            "groups_added": [], "groups_removed": sorted(before["groups"])}
    actor_pk = getattr(actor, "pk", None)
    if actor_pk is not None and not get_user_model().objects.filter(pk=actor_pk).exists():
        actor, data["actor_deleted"] = actor.get_username(), True
    audit_record(actor=actor, action="user.roles", object_type="user", object_id=before["pk"],
                 reason=f"{before['username']}: deleted, with the roles {', '.join(roles)}", data=data)


def user_account_change_record(*, actor, user, created: bool, password_set: bool, renamed_from: str | None) -> None:
    """The account changes that decide who can act as whom, each a row: a user created
    (`user.created`), a password set or changed by anyone (`user.password`: an admin
    who resets someone's password could sign in as them; never the hash), a username
    changed (`user.renamed`: the audit log names actors by it)."""
    username = user.get_username()
    if created:
        audit_record(actor=actor, action="user.created", object_type="user", object_id=user.pk,
                     reason=f"{username}: created" + (" with a password" if password_set else ""),
                     data={"username": username, "password_set": password_set, "is_active": user.is_active})
    elif password_set:
        audit_record(actor=actor, action="user.password", object_type="user", object_id=user.pk,
                     reason=f"{username}: password " + ("set" if user.has_usable_password() else "made unusable"),
                     data={"username": username, "by_self": getattr(actor, "pk", None) == user.pk})
    if renamed_from is not None and not created:
        audit_record(actor=actor, action="user.renamed", object_type="user", object_id=user.pk,
                     reason=f"{renamed_from} is now {username}", data={"before": renamed_from, "after": username})


def user_flags_change_record(*, actor, before: dict | None, after: dict, groups) -> None:
    """One `user.flags` row: the power flags that changed (`before` None: a new user,
    recorded when it starts out with power), with the roles before and after."""
    if before is None:
        if not (after["is_superuser"] or after["is_staff"]):
            return
        before = dict.fromkeys(FLAGS, False)
    changed = {flag: {"before": before[flag], "after": after[flag]} for flag in FLAGS if before[flag] != after[flag]}
    if not changed:
        return
    said = ", ".join(f"{flag} {'on' if values['after'] else 'off'}" for flag, values in changed.items())
    audit_record(actor=actor, action="user.flags", object_type="user", object_id=after["pk"],
                 reason=f"{after['username']}: {said}",
                 data={"username": after["username"], "flags": changed,
                       "roles_before": roles_of(groups, is_superuser=before["is_superuser"]),
                       "roles_after": roles_of(groups, is_superuser=after["is_superuser"])})
