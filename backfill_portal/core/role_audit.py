"""Audit rows for every change of a user's roles: group membership (roles are groups,
core/roles.py), the flags that grant power (`is_superuser`, `is_staff`, `is_active`),
and the deletion of a user who held roles or of a group that is a role; and for the
account changes that decide who can act as whom: a user created, a password set or
changed (by the user, an admin's form or `changepassword`), a username changed.

Receivers, not a service, and on purpose: STYLE.md has the change's own service write
its audit row, but roles change where no service of ours runs: Django's admin (the user
and group change forms), `manage.py createsuperuser`, the demo loader, a shell's
`user.groups.add(...)`. `m2m_changed` on `User.groups.through` and `pre_save`/`post_save`
on the user are the one place all of those pass. Both directions of the relation are
covered (`user.groups.add(g)` and `g.user_set.add(u)`), and add, remove, clear and
`set()` (a remove then an add). A deletion sends no `m2m_changed` (Django deletes the
memberships with the user or group), so `pre_delete` reads the roles before they go and
`post_delete` writes the rows once the row is gone.

Same transaction: Django sends `m2m_changed` inside the `atomic` block of the change
itself, and `audit_record` joins it, so a change and its row commit together or not at
all (a failing audit write undoes the change). The admin saves inside its own `atomic`
block, so a flag changed there is covered the same way; a bare `user.save()` outside any
transaction (autocommit) has committed before `post_save` runs, and its row follows
right after it: wrap such a save in `transaction.atomic()` to make them one.

The actor is the signed-in user of the request being answered (`request_actor`, set by
core.middleware.RequestActorMiddleware), else the system; an actor who deleted their
own account is named only (core.roles.user_delete_record). Not covered: writes that send
no signal (`QuerySet.update()` of the flags, rows written to the through table directly,
`_raw_delete`), and a group renamed (a save of the group: a role group renamed takes
its role from its members unrecorded; docs/security.md "Changes of roles").
"""
from __future__ import annotations

from django.contrib.auth import get_user_model

from backfill_portal.core.middleware import request_actor
from backfill_portal.core.roles import (
    FLAGS,
    Role,
    group_delete_record,
    user_account_change_record,
    user_delete_record,
    user_flags_change_record,
    user_groups_change_record,
)

# What pre_save leaves on a user for post_save: nothing to compare (no flag saved).
_UNCHANGED = object()


def _users_state(user_ids) -> dict[int, dict]:
    """Each user's username, flags and group names, as the database has them now."""
    users = {row["pk"]: {**row, "groups": set()}
             for row in get_user_model().objects.filter(pk__in=user_ids).values("pk", "username", *FLAGS)}
    through = get_user_model().groups.through
    for user_id, name in through.objects.filter(user_id__in=users).values_list("user_id", "group__name"):
        users[user_id]["groups"].add(name)
    return users


def on_groups_changed(sender, instance, action, reverse, model, pk_set, **kwargs) -> None:
    """m2m_changed of User.groups.through: read the users' groups before the change
    (pre_*) and after it (post_*), and record each user whose groups moved."""
    if action.startswith("pre_"):
        if reverse:  # a group's user_set: pk_set are users; a clear takes all its members
            members = get_user_model().objects.filter(groups=instance)
            user_ids = set(pk_set) if pk_set is not None else set(members.values_list("pk", flat=True))
        else:
            user_ids = {instance.pk} if pk_set is None or pk_set else set()
        instance.__dict__.setdefault("_bp_groups_before", []).append(_users_state(user_ids) if user_ids else {})
        return
    before = instance.__dict__["_bp_groups_before"].pop()
    if not reverse:
        instance.__dict__.pop("_bp_roles", None)  # core.roles.user_roles' cache on this very object
    if not before:
        return
    actor = request_actor()
    after = _users_state(before)
    for user_id in sorted(before):
        user_groups_change_record(actor=actor, before=before[user_id], after=after[user_id])


def on_user_pre_save(sender, instance, raw, update_fields, **kwargs) -> None:
    """Remember the flags and username the database has before a save that may change
    them (a save of other fields only, such as the last_login of every sign-in, or the
    hash upgrade of a password that did not change, reads nothing)."""
    if raw or (update_fields is not None and not set(update_fields) & {*FLAGS, "username"}):
        instance._bp_flags_before = _UNCHANGED
        return
    instance._bp_flags_before = (None if instance.pk is None else
                                 sender.objects.filter(pk=instance.pk).values("username", *FLAGS).first())


def on_user_post_save(sender, instance, created, raw, **kwargs) -> None:
    before = instance.__dict__.pop("_bp_flags_before", _UNCHANGED)
    if raw:
        return
    # set_password leaves the new password on the instance until its save ends; a hash
    # upgrade at sign-in clears it first (Django: "hash upgrades shouldn't be
    # considered password changes").
    password_set = getattr(instance, "_password", None) is not None
    old_name = before.get("username") if isinstance(before, dict) else None
    renamed_from = old_name if old_name is not None and old_name != instance.get_username() else None
    if created or password_set or renamed_from is not None:
        user_account_change_record(actor=request_actor(), user=instance, created=created, password_set=password_set,
                                   renamed_from=renamed_from)
    if before is _UNCHANGED:
        return
    if before is not None:
        before = {flag: before[flag] for flag in FLAGS}
    instance.__dict__.pop("_bp_roles", None)
    after = {"pk": instance.pk, "username": instance.get_username(), **{flag: getattr(instance, flag) for flag in FLAGS}}
    groups = [] if created else list(instance.groups.values_list("name", flat=True))
    user_flags_change_record(actor=request_actor(), before=before, after=after, groups=groups)


def on_user_pre_delete(sender, instance, **kwargs) -> None:
    """Remember the roles a user about to be deleted holds (its memberships are deleted
    with it, before post_delete)."""
    instance.__dict__["_bp_deleted_state"] = _users_state({instance.pk}).get(instance.pk)


def on_user_post_delete(sender, instance, **kwargs) -> None:
    before = instance.__dict__.pop("_bp_deleted_state", None)
    if before is not None:
        user_delete_record(actor=request_actor(), before=before)


def on_group_pre_delete(sender, instance, **kwargs) -> None:
    """Remember the members of a role group about to be deleted, and their groups (a
    group that is no role changes nobody's roles: nothing read)."""
    if instance.name in Role.values:
        members = get_user_model().objects.filter(groups=instance).values_list("pk", flat=True)
        instance.__dict__["_bp_deleted_members"] = _users_state(set(members))


def on_group_post_delete(sender, instance, **kwargs) -> None:
    members = instance.__dict__.pop("_bp_deleted_members", None)
    if members:
        group_delete_record(actor=request_actor(), group=instance.name, members=members)


def connect() -> None:
    """Called once, from CoreConfig.ready."""
    from django.contrib.auth.models import Group
    from django.db.models.signals import m2m_changed, post_delete, post_save, pre_delete, pre_save

    user_model = get_user_model()
    m2m_changed.connect(on_groups_changed, sender=user_model.groups.through,
                        dispatch_uid="backfill_portal.core.audit_user_groups")
    pre_save.connect(on_user_pre_save, sender=user_model, dispatch_uid="backfill_portal.core.audit_user_flags_pre")
    post_save.connect(on_user_post_save, sender=user_model, dispatch_uid="backfill_portal.core.audit_user_flags_post")
    pre_delete.connect(on_user_pre_delete, sender=user_model, dispatch_uid="backfill_portal.core.audit_user_delete_pre")
    post_delete.connect(on_user_post_delete, sender=user_model,
                        dispatch_uid="backfill_portal.core.audit_user_delete_post")
    pre_delete.connect(on_group_pre_delete, sender=Group, dispatch_uid="backfill_portal.core.audit_group_delete_pre")
    post_delete.connect(on_group_post_delete, sender=Group, dispatch_uid="backfill_portal.core.audit_group_delete_post")
