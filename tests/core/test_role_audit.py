"""Invariant 8 for roles: every change of a user's groups or power flags, through the
ORM or the admin's change form, writes one audit row with the roles before and after,
in the transaction of the change (core/role_audit.py)."""
from __future__ import annotations

from unittest import mock

import pytest
from django.contrib.auth.models import Group, User
from django.db import transaction
from django.test import Client

from backfill_portal.core.models import AuditEvent
from backfill_portal.core.roles import Role, has_role
from backfill_portal.core.services.audit import audit_verify


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
