"""`load_demo` never leaves users with well-known passwords on a deployment (DEBUG off)
unless it is asked to, and says so in one line."""
from __future__ import annotations

from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client

from backfill_portal.web.management.commands.load_demo import DEMO_USERS, demo_logins_note

EVERYONE = set(DEMO_USERS) | {"admin"}


def load_demo(*args) -> str:
    out = StringIO()
    call_command("load_demo", "--no-data", *args, stdout=out)
    return out.getvalue()


def demo_password_works(username: str) -> bool:
    return Client().post("/login/", {"username": username, "password": f"{username}-demo"}).status_code == 302


@pytest.fixture
def deployment(db, settings, warehouse):
    settings.DEBUG = False
    settings.DEMO_PASSWORDS = False
    return settings


def test_with_debug_off_demo_users_get_no_usable_password_and_it_says_so(deployment):
    output = load_demo()
    assert set(User.objects.values_list("username", flat=True)) == EVERYONE  # they still own the demo datasets
    assert not any(user.has_usable_password() for user in User.objects.all())
    assert not demo_password_works("alice") and not demo_password_works("admin")
    lines = [line for line in output.splitlines() if "without passwords" in line]
    assert lines == ["users: created without passwords because DEBUG is off (the well-known demo passwords only "
                     "with --demo-passwords or DEMO_PASSWORDS=1); set real ones with `manage.py changepassword USER`"]
    assert "catalog:" in output


def test_with_debug_off_the_flag_gives_the_demo_passwords(deployment):
    output = load_demo("--demo-passwords")
    assert "without passwords" not in output
    assert demo_password_works("olivia") and demo_password_works("admin")


def test_with_debug_off_the_environment_setting_gives_the_demo_passwords(deployment):
    deployment.DEMO_PASSWORDS = True
    load_demo()
    assert demo_password_works("alice")


def test_with_debug_on_demo_users_get_their_demo_passwords(db, settings, warehouse):
    settings.DEBUG = True
    output = load_demo()
    assert "without passwords" not in output
    assert demo_password_works("sam") and demo_password_works("admin")


def test_a_second_run_creates_nothing_and_gives_no_password_to_existing_users(deployment):
    load_demo()
    assert "users: 0 created" in load_demo("--demo-passwords")
    assert not demo_password_works("alice")


def test_run_portal_announces_the_demo_passwords_only_when_they_were_given(settings):
    settings.DEBUG, settings.DEMO_PASSWORDS = False, False
    assert "-demo" not in demo_logins_note() and "no passwords" in demo_logins_note()
    settings.DEMO_PASSWORDS = True
    assert "password = username + '-demo'" in demo_logins_note()
    settings.DEBUG, settings.DEMO_PASSWORDS = True, False
    assert "password = username + '-demo'" in demo_logins_note()
