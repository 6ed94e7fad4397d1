"""The API's surface: schema, docs, authentication."""
from __future__ import annotations

import yaml
from django.test import Client
from rest_framework.test import APIClient

from backfill_portal.core.services.tokens import api_token_issue


def test_schema_is_an_openapi_document_listing_the_request_and_audit_endpoints(api):
    response = api("alice").get("/api/schema/")
    assert response.status_code == 200
    doc = yaml.safe_load(response.content)
    assert str(doc["openapi"]).startswith("3.")
    paths = doc["paths"]
    assert "/api/requests/" in paths
    assert "post" in paths["/api/requests/"]
    assert "/api/requests/{id}/submit/" in paths
    assert "post" in paths["/api/requests/{id}/submit/"]
    assert "/api/audit/" in paths
    assert "get" in paths["/api/audit/"]


def test_schema_in_json(api):
    response = api("alice").get("/api/schema/", {"format": "json"})
    assert response.status_code == 200
    assert "/api/requests/{id}/submit/" in response.json()["paths"]


def test_docs_page_renders_for_a_logged_in_user(personas):
    client = Client()
    client.force_login(personas["alice"])
    response = client.get("/api/docs/")
    assert response.status_code == 200
    assert b"swagger" in response.content.lower()


def test_anonymous_api_calls_are_refused_not_errors(db):
    # 401 with the token challenge, not 403: the token scheme is the first authenticator.
    client = APIClient()
    for url in ("/api/requests/", "/api/audit/", "/api/requests/1/"):
        response = client.get(url)
        assert response.status_code == 401, (url, response.status_code)
        assert response["WWW-Authenticate"] == 'Token realm="api"'
        assert response.json()["detail"]
    response = client.post("/api/requests/", {"job": "dwd_order_items"}, format="json")
    assert response.status_code == 401
    response = client.post("/api/requests/1/submit/", {}, format="json")
    assert response.status_code == 401


def test_token_authentication_works(personas, catalog):
    # Tokens are the portal's own now (they expire); DRF's authtoken app is gone.
    _, key = api_token_issue(actor=personas["alice"], user=personas["alice"], via="test")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    response = client.get("/api/requests/")
    assert response.status_code == 200, response.content
    response = client.post("/api/requests/", {"job": "dwd_order_items", "start": "2022-10-01",
                                              "end": "2022-10-02", "reason": "token test"}, format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["requested_by"] == "alice"


def test_a_bad_token_is_refused(db):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Token not-a-real-token")
    response = client.get("/api/requests/")
    # 401 now that the token scheme (listed first) sends its challenge; DRF answered 403 before.
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == 'Token realm="api"'
    assert "token" in response.json()["detail"].lower()


def test_an_unexpected_error_is_a_json_500_without_a_traceback(api, monkeypatch):
    def broken(**kwargs):
        raise RuntimeError("secret internals")

    monkeypatch.setattr("backfill_portal.web.api.requests.request_list", broken)
    response = api("alice").get("/api/requests/")
    assert response.status_code == 500
    body = response.json()
    assert body["code"] == "error"
    assert "secret internals" not in response.content.decode()
    assert "Traceback" not in response.content.decode()


def test_post_only_actions_document_what_they_answer_not_a_list_page(api):
    """The exploratory test: POST .../rollback/rebuild/ answers a plain array of the
    requests filed, but the schema said a paginated page with six list parameters."""
    doc = yaml.safe_load(api("alice").get("/api/schema/").content)
    for path, operation in doc["paths"].items():
        post = operation.get("post")
        if not post:
            continue
        names = {p["name"] for p in post.get("parameters", []) if p["in"] == "query"}
        assert not names & {"cursor", "page_size", "status", "job__name"}, (path, names)
    rebuild = doc["paths"]["/api/requests/{id}/rollback/rebuild/"]["post"]["responses"]["201"]
    assert rebuild["content"]["application/json"]["schema"]["type"] == "array"
