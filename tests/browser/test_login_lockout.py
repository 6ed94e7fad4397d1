"""Password guessing in a real browser: five wrong passwords lock the username, the
right one is then refused too, and the audit log holds every attempt."""
from __future__ import annotations

import re

import pytest

from backfill_portal.core.models import AuditEvent
from tests.browser.conftest import ARTIFACTS

expect = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e .[test])").expect
pytestmark = pytest.mark.django_db(transaction=True)


def test_guessing_a_password_locks_the_username_against_the_right_one(chromium, live_server, personas):
    context = chromium.new_context(viewport={"width": 1360, "height": 900})
    context.set_default_timeout(10_000)
    page = context.new_page()
    try:
        def sign_in(password: str):
            page.goto(live_server.url + "/login/")
            page.get_by_label("Username").fill("alice")
            page.get_by_label("Password").fill(password)
            with page.expect_navigation():
                page.get_by_role("button", name=re.compile("sign in", re.I)).click()

        for attempt in range(4):
            sign_in(f"guess-{attempt}")
            expect(page.get_by_role("alert")).to_contain_text("Please enter a correct username and password")
        sign_in("guess-4")
        expect(page.get_by_role("heading", name="Sign-in locked")).to_be_visible()
        sign_in("pw-alice")
        expect(page.get_by_role("alert")).to_contain_text("locked after 5 failed sign-ins")
        expect(page.get_by_role("alert")).to_contain_text("15 minutes")
        folder = ARTIFACTS / "login-lockout"
        folder.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(folder / "01-alice-locked.png"), full_page=True)
        page.goto(live_server.url + "/requests/")
        assert page.url.startswith(live_server.url + "/login/")  # not signed in
        assert AuditEvent.objects.filter(action="denied.login", object_id="alice").count() == 6
        assert AuditEvent.objects.filter(action="login.locked_out", object_id="alice").count() == 1
    finally:
        context.close()
