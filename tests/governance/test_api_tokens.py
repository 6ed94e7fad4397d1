"""API tokens: obtained at POST /api/auth/token/ (or `manage.py issue_token`), they
expire; a call without credentials is a 401 with its challenge, a wrong role stays 403."""
from __future__ import annotations

import json
import urllib.error
import urllib.request
from datetime import timedelta
from io import StringIO

import pytest
import yaml
from django.core.management import CommandError, call_command
from django.utils import timezone
from rest_framework.test import APIClient

from backfill_portal.core.models import ApiToken, AuditEvent
from backfill_portal.core.services.tokens import api_token_issue

TOKEN = "/api/auth/token/"
CHALLENGE = 'Token realm="api"'


def obtain(username: str, password: str, **extra):
    return APIClient().post(TOKEN, {"username": username, "password": password, **extra}, format="json")


def with_token(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


@pytest.mark.parametrize("method,url", [
    ("get", "/api/requests/"), ("get", "/api/audit/"), ("get", "/api/runs/"), ("get", "/api/datasets/"),
    ("post", "/api/requests/"), ("post", "/api/requests/1/submit/"),
    ("post", "/api/auth/token/revoke/"),
])
def test_a_call_without_credentials_is_401_with_the_token_challenge(db, method, url):
    response = getattr(APIClient(), method)(url, {}, format="json")
    assert response.status_code == 401, (url, response.status_code)
    assert response["WWW-Authenticate"] == CHALLENGE
    assert response.json()["detail"] == "Authentication credentials were not provided."


def test_a_token_from_the_endpoint_works_until_it_expires(personas, catalog):
    before = timezone.now()
    response = obtain("alice", "pw-alice", days=2, label="nightly export")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["username"] == "alice" and body["label"] == "nightly export"
    key = body["token"]
    assert key.startswith("bfp_") and len(key) > 40
    token = ApiToken.objects.get(pk=body["token_id"])
    assert token.user.username == "alice" and token.prefix == key[:12]
    assert key not in token.key_hash  # only a hash is stored
    assert timedelta(days=2) <= token.expires_at - before < timedelta(days=2, minutes=1)
    issued = AuditEvent.objects.get(action="token.issue")
    assert issued.actor_name == "alice" and issued.object_id == str(token.pk) and issued.reason == "nightly export"
    assert issued.data["expires_at"] == token.expires_at.isoformat() and issued.data["via"] == "api"
    assert key not in json.dumps(issued.data)

    client = with_token(key)
    response = client.post("/api/requests/", {"job": "dwd_order_items", "start": "2022-10-01", "end": "2022-10-02",
                                              "reason": "token test"}, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["requested_by"] == "alice"
    bearer = APIClient()
    bearer.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    assert bearer.get("/api/requests/").status_code == 200

    ApiToken.objects.filter(pk=token.pk).update(created_at=before - timedelta(days=3),
                                                expires_at=timezone.now() - timedelta(seconds=1))
    response = client.get("/api/requests/")
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == CHALLENGE
    assert response.json()["detail"].startswith("token expired at ")


def test_the_default_lifetime_is_api_token_days(personas, settings):
    settings.API_TOKEN_DAYS = 7
    response = obtain("olivia", "pw-olivia")
    assert response.status_code == 201
    token = ApiToken.objects.get(pk=response.json()["token_id"])
    assert timedelta(days=7) - timedelta(minutes=1) < token.expires_at - timezone.now() <= timedelta(days=7)


def test_wrong_credentials_are_a_400_naming_the_field_and_are_audited(personas):
    response = obtain("alice", "not-her-password")
    assert response.status_code == 400
    assert response.json()["errors"] == {"password": ["no active user has this username and password"]}
    assert not ApiToken.objects.exists()
    denied = AuditEvent.objects.get(action="denied.login")
    assert denied.object_id == "alice" and denied.data["path"] == TOKEN
    personas["olivia"].is_active = False
    personas["olivia"].save()
    assert obtain("olivia", "pw-olivia").status_code == 400  # an inactive user gets no token


@pytest.mark.parametrize("body,field", [
    ({"password": "pw-alice"}, "username"),
    ({"username": "alice"}, "password"),
    ({"username": "alice", "password": "pw-alice", "days": 0}, "days"),
    ({"username": "alice", "password": "pw-alice", "days": 366}, "days"),
    ({"username": "alice", "password": "pw-alice", "days": "soon"}, "days"),
    ({"username": "alice", "password": "pw-alice", "label": "x" * 101}, "label"),
    ({"username": "a" * 151, "password": "pw-alice"}, "username"),
    ({"username": "alice", "password": "p" * 4097}, "password"),
])
def test_bad_input_to_the_token_endpoint_is_a_400_and_issues_nothing(personas, body, field):
    response = APIClient().post(TOKEN, body, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()["errors"]
    assert not ApiToken.objects.exists()
    assert not AuditEvent.objects.filter(action="token.issue").exists()


@pytest.mark.parametrize("raw", [b"[]", b'"alice"', b"{not json", b"null"])
def test_a_body_that_is_not_an_object_is_a_400(personas, raw):
    response = APIClient().generic("POST", TOKEN, raw, content_type="application/json")
    assert response.status_code == 400, response.content
    assert response.json()["detail"]
    assert not ApiToken.objects.exists()


def test_a_wrong_role_with_a_valid_token_stays_403(personas, catalog):
    key = obtain("audrey", "pw-audrey").json()["token"]
    response = with_token(key).post("/api/requests/", {"job": "dwd_order_items", "start": "2022-10-01",
                                                        "end": "2022-10-02", "reason": "x"}, format="json")
    assert response.status_code == 403
    assert "requester" in response.json()["detail"]
    assert with_token(key).get("/api/audit/").status_code == 200


def test_revoking_the_token_in_use_refuses_it_from_then_on(personas):
    key = obtain("alice", "pw-alice").json()["token"]
    client = with_token(key)
    assert client.get("/api/requests/").status_code == 200
    response = client.post("/api/auth/token/revoke/")
    assert response.status_code == 204
    token = ApiToken.objects.get()
    assert token.revoked_at is not None
    revoked = AuditEvent.objects.get(action="token.revoke")
    assert revoked.actor_name == "alice" and revoked.object_id == str(token.pk)
    for call in (client.get("/api/requests/"), client.post("/api/auth/token/revoke/")):
        assert call.status_code == 401
        assert call.json()["detail"].startswith("token revoked")
    assert AuditEvent.objects.filter(action="token.revoke").count() == 1


def test_revoke_needs_a_token_not_a_session(api):
    response = api("alice").post("/api/auth/token/revoke/")
    assert response.status_code == 400
    assert "Authorization" in response.json()["errors"]


@pytest.mark.parametrize("header", ["Token", "Token a b", "Token nope", "Bearer bfp_unknown"])
def test_malformed_or_unknown_tokens_are_401(db, header):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=header)
    response = client.get("/api/requests/")
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == CHALLENGE
    assert "token" in response.json()["detail"]


def test_a_token_of_a_user_deactivated_later_is_refused(personas):
    _, key = api_token_issue(actor=personas["admin"], user=personas["alice"], via="test")
    personas["alice"].is_active = False
    personas["alice"].save()
    response = with_token(key).get("/api/requests/")
    assert response.status_code == 401 and "inactive" in response.json()["detail"]


def test_issue_token_command_prints_a_key_that_expires_after_its_days(personas):
    out, err = StringIO(), StringIO()
    call_command("issue_token", "oscar", "--days", "3", "--label", "pager bot", stdout=out, stderr=err)
    key = out.getvalue().strip()
    assert key.startswith("bfp_") and "\n" not in key
    assert "expires" in err.getvalue() and "not shown again" in err.getvalue()
    token = ApiToken.objects.get()
    assert token.user.username == "oscar" and token.label == "pager bot"
    assert timedelta(days=3) - timedelta(minutes=1) < token.expires_at - timezone.now() <= timedelta(days=3)
    assert with_token(key).get("/api/runs/").status_code == 200
    issued = AuditEvent.objects.get(action="token.issue")
    assert issued.actor_name == "manage.py issue_token" and issued.data["via"] == "command"


@pytest.mark.parametrize("args,message", [
    (["nobody"], "no user named 'nobody'"),
    (["oscar", "--days", "0"], "days must be a whole number from 1 to 365"),
    (["oscar", "--days", "400"], "days must be a whole number from 1 to 365"),
])
def test_issue_token_command_refuses_bad_input_in_one_line(personas, args, message):
    with pytest.raises(CommandError) as refused:
        call_command("issue_token", *args, stdout=StringIO(), stderr=StringIO())
    assert str(refused.value) == message
    assert not ApiToken.objects.exists()


def test_the_schema_documents_the_token_endpoint_and_scheme(api):
    doc = yaml.safe_load(api("alice").get("/api/schema/").content)
    post = doc["paths"]["/api/auth/token/"]["post"]
    assert set(post["responses"]) == {"201", "400", "429"}
    assert "security" not in post and "security" not in doc  # no credentials needed to get one
    assert doc["components"]["securitySchemes"]["tokenAuth"]["name"] == "Authorization"
    assert {"tokenAuth": []} in doc["paths"]["/api/requests/"]["get"]["security"]
    assert set(doc["paths"]["/api/auth/token/revoke/"]["post"]["responses"]) == {"204", "400", "401", "409"}


@pytest.mark.django_db(transaction=True)
def test_over_real_http_no_credentials_401_then_a_token_gets_in(live_server, personas):
    def call(path, *, data=None, key=None):
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Token {key}"
        request = urllib.request.Request(live_server.url + path, headers=headers,
                                         data=json.dumps(data).encode() if data is not None else None)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, dict(response.headers), json.loads(response.read() or b"null")
        except urllib.error.HTTPError as error:
            return error.code, dict(error.headers), json.loads(error.read() or b"null")

    status, headers, body = call("/api/requests/")
    assert status == 401 and headers["WWW-Authenticate"] == CHALLENGE
    status, _, body = call(TOKEN, data={"username": "alice", "password": "pw-alice", "days": 1})
    assert status == 201, body
    status, _, body = call("/api/requests/", key=body["token"])
    assert status == 200 and body["results"] == []
