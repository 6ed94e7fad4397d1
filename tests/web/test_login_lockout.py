"""Password guessing: a username is locked after LOGIN_FAILURE_LIMIT failed sign-ins,
the right password included, on every sign-in path (the login page, the admin's, the
API's token endpoint), and every failure is in the audit log (never its password)."""
from __future__ import annotations

import csv
import io
from datetime import timedelta

import pytest
from axes.models import AccessAttempt
from django.db import connection
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from backfill_portal.core.models import AuditEvent
from backfill_portal.core.services.audit import audit_verify

LOGIN = "/login/"


def sign_in(client: Client, username: str, password: str, url: str = LOGIN):
    return client.post(url, {"username": username, "password": password})


def signed_in_as(client: Client) -> str | None:
    response = client.get("/")
    if response.status_code != 200:
        return None
    return response.context["user"].username


def events(action: str, username: str) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(action=action, object_id=username).order_by("id"))


def test_five_wrong_passwords_lock_the_username_and_the_right_one_then_fails(personas, settings):
    assert settings.LOGIN_FAILURE_LIMIT == 5
    client = Client()
    for attempt in range(1, 5):
        response = sign_in(client, "alice", f"guess-{attempt}")
        assert response.status_code == 200, attempt
        assert "Please enter a correct username and password" in response.content.decode()
    response = sign_in(client, "alice", "guess-5")
    assert response.status_code == 429
    page = response.content.decode()
    assert "This username is locked after 5 failed sign-ins" in page and "15 minutes" in page
    assert 890 <= int(response["Retry-After"]) <= 900  # seconds left of the 15-minute window

    response = sign_in(client, "alice", "pw-alice")  # the right password
    assert response.status_code == 429
    assert "locked" in response.content.decode()
    assert signed_in_as(client) is None
    # A fresh browser (no cookie, another user agent) is locked out just the same.
    other = Client(HTTP_USER_AGENT="another-browser/1.0", REMOTE_ADDR="10.9.8.7")
    assert sign_in(other, "alice", "pw-alice").status_code == 429
    assert signed_in_as(other) is None

    failed = events("denied.login", "alice")
    assert len(failed) == 7
    assert [e.data["refused_while_locked"] for e in failed] == [False] * 5 + [True, True]
    assert {e.actor_name for e in failed} == {"anonymous"} and all(e.actor_id is None for e in failed)
    assert failed[0].data["ip_address"] == "127.0.0.1" and failed[-1].data["ip_address"] == "10.9.8.7"
    assert failed[0].data["path"] == LOGIN
    locked = events("login.locked_out", "alice")
    assert len(locked) == 1 and locked[0].id > failed[4].id
    assert locked[0].reason == "5 failed sign-ins: locked for 15 minutes"
    everything = " ".join(str(e.data) + e.reason for e in AuditEvent.objects.all())
    assert "guess-" not in everything and "pw-alice" not in everything
    assert audit_verify() == (AuditEvent.objects.count(), None)  # chained like every other event


def test_the_lock_is_per_username(personas):
    client = Client()
    for attempt in range(5):
        sign_in(client, "alice", f"guess-{attempt}")
    assert sign_in(client, "alice", "pw-alice").status_code == 429
    response = sign_in(Client(), "olivia", "pw-olivia")
    assert response.status_code == 302
    other = Client()
    sign_in(other, "olivia", "pw-olivia")
    assert signed_in_as(other) == "olivia"


def test_a_good_sign_in_before_the_limit_clears_the_count(personas):
    client = Client()
    for attempt in range(4):
        sign_in(client, "alice", f"guess-{attempt}")
    assert sign_in(client, "alice", "pw-alice").status_code == 302
    client.logout()
    for attempt in range(4):
        assert sign_in(client, "alice", f"guess-{attempt}").status_code == 200
    assert sign_in(client, "alice", "pw-alice").status_code == 302
    assert signed_in_as(client) == "alice"
    assert not events("login.locked_out", "alice")


def test_the_lock_ends_after_the_lockout_window(personas):
    client = Client()
    for attempt in range(5):
        sign_in(client, "alice", f"guess-{attempt}")
    assert sign_in(client, "alice", "pw-alice").status_code == 429
    # As if the window had passed: the failures are older than LOGIN_LOCKOUT_MINUTES.
    AccessAttempt.objects.filter(username="alice").update(attempt_time=timezone.now() - timedelta(minutes=16))
    assert sign_in(client, "alice", "pw-alice").status_code == 302
    assert signed_in_as(client) == "alice"


def test_the_lockout_says_how_long_is_left(personas):
    client = Client()
    for attempt in range(5):
        sign_in(client, "alice", f"guess-{attempt}")
    AccessAttempt.objects.filter(username="alice").update(attempt_time=timezone.now() - timedelta(minutes=10))
    response = sign_in(client, "alice", "pw-alice")
    assert response.status_code == 429
    assert "Try again in 5 minutes" in response.content.decode()
    assert 290 <= int(response["Retry-After"]) <= 300
    response = APIClient().post("/api/auth/token/", {"username": "alice", "password": "pw-alice"}, format="json")
    assert response.status_code == 429 and "Try again in 5 minutes" in response.json()["detail"]
    assert 290 <= int(response["Retry-After"]) <= 300


def test_an_unknown_username_locks_too_and_is_audited(db):
    client = Client()
    for attempt in range(5):
        sign_in(client, "nobody-here", f"guess-{attempt}")
    assert sign_in(client, "nobody-here", "x").status_code == 429
    assert len(events("denied.login", "nobody-here")) == 6
    assert len(events("login.locked_out", "nobody-here")) == 1


def test_the_admin_sign_in_is_locked_by_the_same_count(personas):
    client = Client()
    for attempt in range(3):
        sign_in(client, "admin", f"guess-{attempt}")
    for attempt in range(2):
        sign_in(client, "admin", f"guess-{attempt}", url="/admin/login/")
    response = sign_in(client, "admin", "pw-admin", url="/admin/login/?next=/admin/")
    assert response.status_code == 429
    assert client.get("/admin/").status_code == 302  # still sent to sign in
    assert {e.data["path"] for e in events("denied.login", "admin")} == {LOGIN, "/admin/login/"}


def test_the_token_endpoint_counts_towards_the_lock_and_answers_429_json(personas):
    api = APIClient()
    for attempt in range(4):
        response = api.post("/api/auth/token/", {"username": "alice", "password": f"guess-{attempt}"}, format="json")
        assert response.status_code == 400, response.content
        assert response.json()["errors"]["password"] == ["no active user has this username and password"]
    response = api.post("/api/auth/token/", {"username": "alice", "password": "guess-4"}, format="json")
    assert response.status_code == 429
    assert response.json() == {"code": "locked_out", "detail": "This username is locked after 5 failed sign-ins. "
                               "Try again in 15 minutes, or ask an admin to unlock it."}
    assert 890 <= int(response["Retry-After"]) <= 900
    response = api.post("/api/auth/token/", {"username": "alice", "password": "pw-alice"}, format="json")
    assert response.status_code == 429
    assert "token" not in response.json()
    # The web sign-in shares the count: locked there too.
    assert sign_in(Client(), "alice", "pw-alice").status_code == 429
    assert [e.data["path"] for e in events("denied.login", "alice")] == ["/api/auth/token/"] * 6 + [LOGIN]
    assert len(events("login.locked_out", "alice")) == 1


@pytest.mark.parametrize("limit", [2])
def test_the_limit_and_window_come_from_settings(personas, settings, limit):
    settings.LOGIN_FAILURE_LIMIT = settings.AXES_FAILURE_LIMIT = limit
    client = Client()
    assert sign_in(client, "alice", "guess-1").status_code == 200
    assert sign_in(client, "alice", "guess-2").status_code == 429
    assert "locked after 2 failed sign-ins" in sign_in(client, "alice", "pw-alice").content.decode()


def test_an_auditor_finds_failed_sign_ins_with_the_hostile_username_made_harmless(web, personas):
    hostile = '=HYPERLINK("http://evil.example")<script>x</script>'
    sign_in(Client(), hostile, "whatever")
    page = web("audrey").get("/audit/", {"action": "denied.login"}).content.decode()
    assert "denied.login" in page and "anonymous" in page
    assert "<script>x</script>" not in page and "&lt;script&gt;x&lt;/script&gt;" in page
    export = web("audrey").get("/audit/", {"action": "denied.login", "format": "csv"})
    rows = list(csv.DictReader(io.StringIO(b"".join(export.streaming_content).decode())))
    assert len(rows) == 1
    assert rows[0]["object_id"] == "'" + hostile[:64]  # the spreadsheet sees text, not a formula


@pytest.mark.postgres
@pytest.mark.skipif(connection.vendor != "postgresql", reason="concurrent requests need PostgreSQL: the SQLite test "
                    "database is in memory, shared by the live server's threads without a busy timeout")
@pytest.mark.django_db(transaction=True)
def test_a_burst_of_concurrent_guesses_over_http_still_locks_the_username(live_server, personas):
    """20 wrong passwords at once (real HTTP, a thread each), then the right one: refused,
    and every guess is in the audit log. (Guesses that pass the lock check before the
    fifth failure is recorded are still checked: axes counts after the password check.)"""
    import http.cookiejar
    import re as regex
    import urllib.error
    import urllib.parse
    import urllib.request
    from concurrent.futures import ThreadPoolExecutor

    def post_login(password: str) -> int:
        jar = http.cookiejar.CookieJar()
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        with opener.open(live_server.url + LOGIN, timeout=30) as page:
            token = regex.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.read().decode()).group(1)
        body = urllib.parse.urlencode({"username": "alice", "password": password,
                                       "csrfmiddlewaretoken": token}).encode()
        request = urllib.request.Request(live_server.url + LOGIN, data=body, headers={"Referer": live_server.url})
        try:
            with opener.open(request, timeout=30) as response:
                return 302 if response.url.rstrip("/") == live_server.url.rstrip("/") else response.status
        except urllib.error.HTTPError as error:
            return error.code

    with ThreadPoolExecutor(max_workers=10) as pool:
        answers = list(pool.map(post_login, [f"guess-{n}" for n in range(20)]))
    assert set(answers) <= {200, 429} and 429 in answers, answers
    assert post_login("pw-alice") == 429
    assert AuditEvent.objects.filter(action="denied.login", object_id="alice").count() == 21
    print(f"burst of 20: {answers.count(200)} answered as a wrong password, {answers.count(429)} as locked")


@pytest.mark.parametrize("url", [LOGIN, "/admin/login/"])
def test_a_username_or_password_too_long_to_be_anyones_is_the_sign_in_error_not_a_500(personas, url):
    """The exploratory test: a 256-character username reached django-axes, whose failed
    attempt row holds 255 characters: a 500 on PostgreSQL, before anyone signed in."""
    client = Client()
    for username, password in (("a" * 256, "x"), ("a" * 100_000, "x"), ("alice", "p" * 5000)):
        response = sign_in(client, username, password, url)
        assert response.status_code == 200, (len(username), response.status_code)
        assert "at most" in response.content.decode()
        assert signed_in_as(client) is None
    assert not AccessAttempt.objects.filter(username__startswith="aaaa").exists()
    if url == LOGIN:  # and the right ones still sign in (alice is no staff member for the admin's)
        assert sign_in(client, "alice", "pw-alice", url).status_code == 302
        assert signed_in_as(client) == "alice"
