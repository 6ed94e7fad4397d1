"""Invariant 8 for roles: every change of a user's groups or power flags, and every
deletion of a user who held roles or of a group that is a role, through the ORM or the
admin, writes one audit row per user with the roles before and after, in the
transaction of the change (core/role_audit.py)."""
from __future__ import annotations

from unittest import mock

import pytest
from django.contrib.auth.models import Group, User
from django.db import transaction
from django.db.models import ProtectedError
from django.test import Client

from backfill_portal.core.models import AuditEvent
from backfill_portal.core.roles import Role, has_role
from backfill_portal.core.services.audit import audit_record, audit_verify


def events_since(last_id: int, action: str = "user.roles") -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(pk__gt=last_id, action=action).order_by("id"))


def last_event_id() -> int:
    return AuditEvent.objects.order_by("-id").values_list("id", flat=True).first() or 0


@pytest.fixture
def admin_client(personas) -> Client:
    client = Client()
    client.force_login(personas["admin"])
    return client


def change_form(user: User, *, groups, **overrides) -> dict:
    """What the admin's user change form posts: the user as it is, with `groups`."""
    data = {
        "username": user.username, "first_name": user.first_name, "last_name": user.last_name,
        "email": user.email, "date_joined_0": user.date_joined.strftime("%Y-%m-%d"),
        "date_joined_1": user.date_joined.strftime("%H:%M:%S"), "last_login_0": "", "last_login_1": "",
        "groups": [group.pk for group in groups], "_save": "Save",
    }
    data.update({flag: "on" for flag in ("is_active", "is_staff", "is_superuser") if getattr(user, flag)})
    data.update(overrides)
    return {key: value for key, value in data.items() if value is not None}


def group(role: str) -> Group:
    return Group.objects.get_or_create(name=role)[0]


# --- the ORM ------------------------------------------------------------------------------


def test_adding_a_group_through_the_orm_is_audited_with_roles_before_and_after(audrey):
    since = last_event_id()
    audrey.groups.add(group(Role.ONCALL))
    [event] = events_since(since)
    assert (event.actor_name, event.object_type, event.object_id) == ("system", "user", str(audrey.pk))
    assert event.data["roles_before"] == ["auditor"] and event.data["roles_after"] == ["auditor", "oncall"]
    assert event.data["groups_added"] == ["oncall"] and "added to oncall" in event.reason
    assert has_role(audrey, Role.ONCALL)  # the cached roles of this very object were dropped too
    assert audit_verify() == (AuditEvent.objects.count(), None)


def test_removing_a_group_through_the_orm_is_audited(oscar):
    since = last_event_id()
    oscar.groups.remove(group(Role.ONCALL))
    [event] = events_since(since)
    assert (event.data["roles_before"], event.data["roles_after"]) == (["oncall"], [])
    assert event.data["groups_removed"] == ["oncall"]


def test_adding_a_group_a_user_already_has_writes_nothing_but_clear_and_the_group_side_are_audited(oscar, alice):
    since = last_event_id()
    oscar.groups.add(group(Role.ONCALL))
    assert events_since(since) == []
    group(Role.ONCALL).user_set.add(alice)
    oscar.groups.clear()
    added, cleared = events_since(since)
    assert (added.object_id, added.data["roles_after"]) == (str(alice.pk), ["oncall", "requester"])
    assert (cleared.object_id, cleared.data["roles_before"], cleared.data["roles_after"]) == (
        str(oscar.pk), ["oncall"], [])


def test_a_role_change_rolled_back_leaves_no_audit_row(audrey):
    since = last_event_id()
    with pytest.raises(RuntimeError), transaction.atomic():
        audrey.groups.add(group(Role.ONCALL))
        assert len(events_since(since)) == 1  # written with the change, inside its transaction
        raise RuntimeError("the change fails after the add")
    assert events_since(since) == [] and not audrey.groups.filter(name=Role.ONCALL).exists()


def test_a_role_change_whose_audit_row_cannot_be_written_does_not_happen(audrey):
    with mock.patch("backfill_portal.core.roles.audit_record", side_effect=RuntimeError("audit log unavailable")):
        with pytest.raises(RuntimeError), transaction.atomic():
            audrey.groups.add(group(Role.ONCALL))
    assert not User.objects.get(pk=audrey.pk).groups.filter(name=Role.ONCALL).exists()


def test_power_flags_changed_through_the_orm_are_audited_and_a_sign_in_save_is_not(audrey, personas):
    [created] = AuditEvent.objects.filter(action="user.flags", object_id=str(personas["admin"].pk))
    assert created.data["flags"]["is_superuser"] == {"before": False, "after": True}
    since = last_event_id()
    audrey.last_login = audrey.date_joined
    audrey.save(update_fields=["last_login"])
    audrey.first_name = "Audrey"
    audrey.save()
    assert events_since(since, "user.flags") == []
    with transaction.atomic():
        audrey.is_superuser = True
        audrey.save()
    [event] = events_since(since, "user.flags")
    assert event.data["flags"] == {"is_superuser": {"before": False, "after": True}}
    assert (event.data["roles_before"], event.data["roles_after"]) == (["auditor"], ["admin", "auditor"])


# --- the admin ------------------------------------------------------------------------------


def test_admin_adding_a_group_in_the_change_form_is_audited_with_the_admin_as_actor(admin_client, audrey, personas):
    since = last_event_id()
    response = admin_client.post(f"/admin/auth/user/{audrey.pk}/change/",
                                 change_form(audrey, groups=[group(Role.AUDITOR), group(Role.ONCALL)]))
    assert response.status_code == 302, response.content[:2000]
    [event] = events_since(since)
    assert event.actor_id == personas["admin"].pk and event.actor_name == "admin"
    assert (event.data["roles_before"], event.data["roles_after"]) == (["auditor"], ["auditor", "oncall"])
    assert has_role(User.objects.get(pk=audrey.pk), Role.ONCALL)
    assert events_since(since, "user.flags") == []  # the form saved the user too, its flags unchanged


def test_admin_removing_a_group_in_the_change_form_is_audited(admin_client, personas):
    olivia = personas["olivia"]
    since = last_event_id()
    response = admin_client.post(f"/admin/auth/user/{olivia.pk}/change/",
                                 change_form(olivia, groups=[group(Role.REQUESTER)]))
    assert response.status_code == 302
    [event] = events_since(since)
    assert (event.actor_name, event.data["groups_removed"]) == ("admin", ["owner"])
    assert (event.data["roles_before"], event.data["roles_after"]) == (["owner", "requester"], ["requester"])


def test_admin_change_form_refused_writes_nothing_and_the_corrected_one_writes_one_row(admin_client, audrey):
    since = last_event_id()
    groups = [group(Role.AUDITOR), group(Role.ONCALL)]
    refused = admin_client.post(f"/admin/auth/user/{audrey.pk}/change/", change_form(audrey, groups=groups, username=""))
    assert refused.status_code == 200 and b"This field is required" in refused.content
    assert AuditEvent.objects.filter(pk__gt=since, action__startswith="user.").count() == 0
    assert not has_role(User.objects.get(pk=audrey.pk), Role.ONCALL)
    saved = admin_client.post(f"/admin/auth/user/{audrey.pk}/change/", change_form(audrey, groups=groups))
    assert saved.status_code == 302
    assert len(events_since(since)) == 1


def test_admin_granting_superuser_in_the_change_form_is_audited(admin_client, audrey):
    since = last_event_id()
    response = admin_client.post(f"/admin/auth/user/{audrey.pk}/change/",
                                 change_form(audrey, groups=[group(Role.AUDITOR)], is_staff="on", is_superuser="on"))
    assert response.status_code == 302
    [event] = events_since(since, "user.flags")
    assert event.actor_name == "admin"
    assert event.data["flags"] == {"is_superuser": {"before": False, "after": True},
                                   "is_staff": {"before": False, "after": True}}
    assert (event.data["roles_before"], event.data["roles_after"]) == (["auditor"], ["admin", "auditor"])
    assert events_since(since) == []  # the groups were posted unchanged


# --- deletions: a user who held roles, a group that is a role ------------------------------------


def test_deleting_a_user_with_roles_writes_one_row_naming_the_roles(olivia):
    olivia.groups.add(Group.objects.create(name="analysts"))  # a group that is no role
    since, pk = last_event_id(), olivia.pk
    olivia.delete()
    [event] = events_since(since)
    assert (event.actor_id, event.actor_name, event.object_type, event.object_id) == (None, "system", "user", str(pk))
    assert event.reason == "olivia: deleted, with the roles owner, requester"
    assert (event.data["roles_before"], event.data["roles_after"]) == (["owner", "requester"], [])
    assert event.data["groups_removed"] == ["analysts", "owner", "requester"] and event.data["deleted"] is True
    assert audit_verify() == (AuditEvent.objects.count(), None)


def test_deleting_a_user_without_roles_writes_nothing(personas):
    staff = User.objects.create_user("stella", is_staff=True)  # staff, but no role
    staff.groups.add(Group.objects.create(name="analysts"))
    since = last_event_id()
    personas["outsider"].delete()
    staff.delete()
    assert AuditEvent.objects.filter(pk__gt=since).count() == 0


def test_deleting_a_role_group_writes_a_row_for_each_of_its_members(alice, oscar):
    oncall = group(Role.ONCALL)
    oncall.user_set.add(alice)
    since = last_event_id()
    oncall.delete()
    rows = {event.object_id: event for event in events_since(since)}
    assert set(rows) == {str(alice.pk), str(oscar.pk)}
    assert (rows[str(alice.pk)].data["roles_before"], rows[str(alice.pk)].data["roles_after"]) == (
        ["oncall", "requester"], ["requester"])
    assert (rows[str(oscar.pk)].data["roles_before"], rows[str(oscar.pk)].data["roles_after"]) == (["oncall"], [])
    event = rows[str(oscar.pk)]
    assert event.reason == "oscar: removed from oncall (the group oncall was deleted)"
    assert (event.data["groups_removed"], event.data["group_deleted"], event.actor_name) == (["oncall"], "oncall",
                                                                                           "system")
    assert not has_role(User.objects.get(pk=alice.pk), Role.ONCALL)


def test_deleting_a_group_that_is_no_role_writes_nothing(alice, oscar):
    analysts = Group.objects.create(name="analysts")
    analysts.user_set.add(alice, oscar)
    since = last_event_id()
    analysts.delete()
    assert AuditEvent.objects.filter(pk__gt=since).count() == 0


def test_admin_deleting_a_user_in_the_admin_is_audited_with_the_admin_as_actor(admin_client, oscar, personas):
    since = last_event_id()
    response = admin_client.post(f"/admin/auth/user/{oscar.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302 and not User.objects.filter(pk=oscar.pk).exists()
    [event] = events_since(since)
    assert (event.actor_id, event.actor_name, event.data["roles_before"]) == (personas["admin"].pk, "admin", ["oncall"])
    assert "actor_deleted" not in event.data


@pytest.mark.django_db(transaction=True)  # the admin's transaction commits: its deferred checks run
def test_admin_deleting_their_own_account_in_the_admin_is_audited_by_name(admin_client, personas):
    admin = personas["admin"]
    since = last_event_id()
    page = admin_client.get(f"/admin/auth/user/{admin.pk}/delete/")
    assert page.status_code == 200 and b"protected" not in page.content
    response = admin_client.post(f"/admin/auth/user/{admin.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302 and not User.objects.filter(pk=admin.pk).exists()
    [event] = events_since(since)
    # Not pointing at the deleted user (which would fail the deletion): named only.
    assert (event.actor_id, event.actor_name, event.object_id) == (None, "admin", str(admin.pk))
    assert (event.data["roles_before"], event.data["roles_after"], event.data["actor_deleted"]) == (["admin"], [], True)
    assert event.reason == "admin: deleted, with the roles admin"
    assert audit_verify() == (AuditEvent.objects.count(), None)


@pytest.mark.django_db(transaction=True)  # the admin's transaction commits: its deferred checks run
def test_admin_deleting_themselves_among_others_names_themselves_on_every_row(admin_client, personas):
    admin, oscar, outsider = personas["admin"], personas["oscar"], personas["outsider"]
    since = last_event_id()
    response = admin_client.post("/admin/auth/user/", {
        "action": "delete_selected", "_selected_action": [admin.pk, oscar.pk, outsider.pk], "post": "yes"})
    assert response.status_code == 302
    assert not User.objects.filter(pk__in=[admin.pk, oscar.pk, outsider.pk]).exists()
    events = events_since(since)
    assert sorted(event.object_id for event in events) == sorted([str(admin.pk), str(oscar.pk)])  # outsider: no role
    assert {(event.actor_id, event.actor_name) for event in events} == {(None, "admin")}


def test_a_deletion_rolled_back_leaves_no_audit_row(olivia, oscar):
    since, pk = last_event_id(), olivia.pk
    with pytest.raises(RuntimeError), transaction.atomic():
        olivia.delete()
        group(Role.ONCALL).delete()
        assert len(events_since(since)) == 2  # written with the deletions, inside their transaction
        raise RuntimeError("the change fails after the deletions")
    assert events_since(since) == []
    assert User.objects.filter(pk=pk).exists() and has_role(User.objects.get(pk=oscar.pk), Role.ONCALL)


def test_a_deletion_whose_audit_row_cannot_be_written_does_not_happen(olivia):
    pk = olivia.pk
    with mock.patch("backfill_portal.core.roles.audit_record", side_effect=RuntimeError("audit log unavailable")):
        with pytest.raises(RuntimeError), transaction.atomic():
            olivia.delete()
    assert User.objects.filter(pk=pk).exists()


def test_a_user_who_acted_in_the_audit_log_cannot_be_deleted_and_nothing_is_written(admin_client, oscar):
    with transaction.atomic():
        audit_record(actor=oscar, action="request.cancel", object_type="request", object_id=1)
    since = last_event_id()
    page = admin_client.get(f"/admin/auth/user/{oscar.pk}/delete/")
    assert b"would require deleting the following protected related objects" in page.content
    with pytest.raises(ProtectedError), transaction.atomic():
        oscar.delete()
    assert AuditEvent.objects.filter(pk__gt=since).count() == 0 and User.objects.filter(username="oscar").exists()


def test_renaming_a_role_group_is_not_audited(oscar):
    """The documented gap (docs/security.md "Changes of roles"): a save of a group sends
    no membership signal, and a role is a group's name."""
    since = last_event_id()
    oncall = group(Role.ONCALL)
    oncall.name = "oncall-old"
    oncall.save()
    assert not has_role(User.objects.get(pk=oscar.pk), Role.ONCALL)
    assert AuditEvent.objects.filter(pk__gt=since).count() == 0


# --- the account: who can act as whom ------------------------------------------------------


def test_an_admin_resetting_a_password_creating_a_user_or_renaming_one_is_audited(personas, admin_client):
    """The auditor's QA: an admin could reset olivia's password in the admin, sign in as
    her and approve, and the audit log held nothing of the reset. Never the hash."""
    olivia = personas["olivia"]
    since = last_event_id()
    response = admin_client.post(f"/admin/auth/user/{olivia.pk}/password/",
                                 {"password1": "N3w-secret-pw!", "password2": "N3w-secret-pw!",
                                  "usable_password": "true"})
    assert response.status_code == 302, response.content.decode()[:500]
    [reset] = events_since(since, "user.password")
    assert (reset.actor_name, reset.object_id, reset.reason) == ("admin", str(olivia.pk), "olivia: password set")
    assert reset.data == {"username": "olivia", "by_self": False}
    assert "N3w-secret-pw!" not in str(reset.data) and olivia.password[:20] not in str(reset.data)

    since = last_event_id()
    response = admin_client.post("/admin/auth/user/add/", {"username": "mallory", "password1": "Xy-98765-pw!",
                                                           "password2": "Xy-98765-pw!", "usable_password": "true"})
    assert response.status_code == 302, response.content.decode()[:500]
    [created] = events_since(since, "user.created")
    assert (created.actor_name, created.reason) == ("admin", "mallory: created with a password")
    assert not events_since(since, "user.password")  # the creation says it

    mallory = User.objects.get(username="mallory")
    since = last_event_id()
    mallory.username = "mallory2"
    mallory.save()
    [renamed] = events_since(since, "user.renamed")
    assert renamed.reason == "mallory is now mallory2"
    assert audit_verify() == (AuditEvent.objects.count(), None)


def test_signing_in_or_a_password_hash_upgrade_is_no_password_change(personas):
    since = last_event_id()
    signed_in = Client().post("/login/", {"username": "olivia", "password": "pw-olivia"})
    assert signed_in.status_code == 302
    User.objects.get(username="olivia").check_password("pw-olivia")  # may upgrade the hash: not a change
    assert not events_since(since, "user.password")
