"""No request answers 500 (issue 13, §4): each server error schemathesis or a hand test
found, in-process and fast, and every refusal checked against the documented schema
(status, content type, body) by schemathesis' own validator. The live-server fuzz of
the whole API is tests/fuzz/run_fuzz.py, run by .ci/run on both backends."""
from __future__ import annotations

import json

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from django.test import Client

from backfill_portal.backfills.models import BackfillRequest
from backfill_portal.core.models import AuditEvent
from backfill_portal.core.services.tokens import api_token_issue
from backfill_portal.wsgi import application

NOT_IDS = ["abc", "null,null", "1.5", "-1", "1e3", "9" * 19]
NUL = "a\x00b"


@pytest.fixture
def openapi(personas):
    """The API's own schema, driven through the WSGI application (real requests, the
    whole middleware stack), with a token per persona."""
    # As Django's test client does: the raw WSGI handler would otherwise close the test's
    # connection (and its open transaction) around each request on PostgreSQL.
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    tokens = {name: api_token_issue(actor=user, user=user, label="schema test", via="api")[1]
              for name, user in personas.items()}
    schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", application,
                                            headers={"Authorization": f"Token {tokens['audrey']}"})

    def call(method: str, path: str, *, as_: str = "alice", validate: bool = True, **kwargs):
        case = schema[path][method].Case(headers={"Authorization": f"Token {tokens[as_]}"}, **kwargs)
        response = case.call()
        if validate:
            case.validate_response(response)  # documented status, content type and body
        return response

    call.schema = schema
    yield call
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


def content_type(response) -> str:
    value = {k.lower(): v for k, v in response.headers.items()}["content-type"]
    return value[0] if isinstance(value, list) else value


def error_detail(response) -> str:
    body = response.json()
    assert isinstance(body["detail"], str) and body["detail"], body
    return body["detail"]


# -- 1. a non-integer id: the approvals' decide actions raised ValueError --------------------

@pytest.mark.parametrize("action", ["approve", "reject"])
def test_a_non_numeric_approval_step_id_is_a_404_not_a_500(openapi, catalog, action):
    for bad in NOT_IDS:
        response = openapi("POST", f"/api/approvals/{{id}}/{action}/", path_parameters={"id": bad},
                           body={"comment": "x"}, media_type="application/json", as_="olivia", validate=False)
        assert response.status_code == 404, (bad, response.status_code, response.text)
        assert content_type(response).startswith("application/json")
        error_detail(response)
    assert not AuditEvent.objects.filter(action__startswith="approval").exists()


def test_every_route_taking_an_id_answers_404_to_one_that_is_not_a_number(openapi, api, catalog):
    client = api("olivia")
    paths = openapi.schema.raw_schema["paths"]
    checked = 0
    for template, operations in paths.items():
        if "{id}" not in template:
            continue
        url = template.replace("{id}", "abc").replace("{key}", "2022-10-01")
        for method in operations:
            response = getattr(client, method)(url, {}, format="json") if method == "post" else client.get(url)
            assert response.status_code == 404, (method, url, response.status_code)
            assert response["Content-Type"].startswith("application/json"), (method, url)
            checked += 1
    assert checked >= 20


# -- 2. a NUL byte in a path parameter, the query or a header (500 on PostgreSQL) ----------

API_NUL_ROUTES = [
    ("GET", "/api/datasets/{name}/", {"name": NUL}),
    ("GET", "/api/jobs/{name}/", {"name": NUL}),
    ("GET", "/api/runs/{run_id}/", {"run_id": NUL}),
    ("GET", "/api/datasets/{name}/partitions/{key}/", {"name": "dwd_order_items", "key": NUL}),
    ("POST", "/api/datasets/{name}/partitions/{key}/rollback/", {"name": "dwd_order_items", "key": NUL}),
    ("POST", "/api/datasets/{name}/partitions/{key}/rollback/rebuild/", {"name": "dwd_order_items", "key": NUL}),
    ("POST", "/api/requests/{id}/intervals/{key}/explain/", {"id": 1, "key": NUL}),
]


@pytest.mark.parametrize(("method", "path", "params"), API_NUL_ROUTES, ids=[f"{m} {p}" for m, p, _ in API_NUL_ROUTES])
def test_a_nul_byte_in_an_api_path_parameter_is_a_documented_400(openapi, catalog, method, path, params):
    before = AuditEvent.objects.count()
    extra = {"body": {"reason": "r", "explanation": "e"}, "media_type": "application/json"} if method == "POST" else {}
    response = openapi(method, path, path_parameters=params, as_="oscar", **extra)
    assert response.status_code == 400, response.text
    assert "NUL" in error_detail(response)
    assert AuditEvent.objects.count() == before


WEB_NUL_ROUTES = [
    "/runs/a%00b/",
    "/datasets/dwd_order_items/partitions/a%00b/",
    "/datasets/dwd_order_items/partitions/a%00b/rollback/",
    "/datasets/dwd_order_items/partitions/a%00b/rebuild-consumers/",
]


@pytest.mark.parametrize("url", WEB_NUL_ROUTES)
def test_a_nul_byte_in_a_page_path_parameter_is_a_400(personas, catalog, url):
    client = Client()
    client.force_login(personas["oscar"])
    before = AuditEvent.objects.count()
    for response in (client.get(url), client.post(url, {"reason": "r"})):
        assert response.status_code == 400, (url, response.status_code)
        assert "NUL" in response.content.decode()
        assert "Traceback" not in response.content.decode()
    assert AuditEvent.objects.count() == before


def test_a_nul_byte_in_the_query_string_is_a_documented_400(openapi, personas, catalog):
    response = openapi("GET", "/api/audit/", query={"actor": NUL})
    assert response.status_code == 400
    assert "NUL" in error_detail(response)
    client = Client()
    client.force_login(personas["alice"])
    assert client.get("/requests/", {"status": NUL}).status_code == 400


@pytest.mark.parametrize("header", [{"HTTP_AUTHORIZATION": "Token abc\x00def"},
                                    {"HTTP_COOKIE": "sessionid=abcdefghij\x00klmnop"}])
def test_a_nul_byte_in_a_credential_header_is_a_400_before_any_lookup(db, header):
    response = Client().get("/api/requests/", **header)
    assert response.status_code == 400
    assert "NUL" in error_detail(response)


def test_a_nul_character_in_a_json_key_or_value_is_a_400_and_creates_nothing(openapi, catalog):
    body = {"job": "dwd_order_items", "start": "2022-10-01", "end": "2022-10-02", "reason": "nul key",
            "cascade": "cascade", "node_actions": {NUL: "skip"}}
    for sent in (body, {**body, "node_actions": {}, "reason": NUL}):
        response = openapi("POST", "/api/requests/", body=sent, media_type="application/json")
        assert response.status_code == 400, response.text
        error_detail(response)
    assert not BackfillRequest.objects.exists()



@pytest.mark.parametrize("url, form", [
    ("/requests/preview/", {"job": "dws_sales_daily\x00", "start": "2022-10-01", "end": "2022-10-02"}),
    ("/requests/new/", {"job": "dwd_order_items", "start": "2022-10-01", "end": "2022-10-02", "reason": "r",
                        "cascade": "none", "strategy": "forward", "max_active_intervals": 4,
                        "side_effects": "nf\x00", "action": "create"}),
    ("/requests/new/", {"job": "dwd_order_items", "start": "2022-10-01", "end": "2022-10-02", "reason": "r",
                        "idempotency_key": "ab\x00cd", "action": "create"}),
    ("/api/requests/", {"job": "dwd_order_items", "start": "2022-10-01", "end": "2022-10-02", "reason": "r\x00"}),
])
@pytest.mark.parametrize("multipart", [False, True], ids=["urlencoded", "multipart"])
def test_a_nul_character_in_a_form_field_is_a_400_and_creates_nothing(personas, catalog, url, form, multipart):
    """The exploratory test: a NUL in a page's form field (the preview's job, a side
    effect) was a 500 on PostgreSQL, which cannot store one in text."""
    client = Client()
    client.force_login(personas["alice"])
    if multipart:
        response = client.post(url, form)
    else:
        from urllib.parse import urlencode

        response = client.post(url, urlencode(form), content_type="application/x-www-form-urlencoded")
    assert response.status_code == 400, (response.status_code, response.content[:300])
    # The pages' answer names it; DRF's names the field ("Null characters are not allowed").
    assert b"NUL" in response.content or b"Null characters" in response.content, response.content[:300]
    assert not BackfillRequest.objects.exists()

# -- 3. a body over DATA_UPLOAD_MAX_MEMORY_SIZE: 413, not 500 --------------------------------

def test_an_api_body_over_the_upload_limit_is_a_documented_413_and_creates_nothing(openapi, catalog, settings):
    before = AuditEvent.objects.count()
    body = {"job": "dwd_order_items", "start": "2022-10-01", "end": "2022-10-02", "reason": "r" * 3 * 1024 * 1024}
    response = openapi("POST", "/api/requests/", body=body, media_type="application/json")
    assert response.status_code == 413, response.text
    assert response.json()["code"] == "too_large"
    assert str(settings.DATA_UPLOAD_MAX_MEMORY_SIZE) in error_detail(response)
    assert not BackfillRequest.objects.exists()
    assert AuditEvent.objects.count() == before
    # The limit is the setting's, not a constant: a small one refuses a small body.
    created = openapi("POST", "/api/requests/", body={**body, "reason": "late events"},
                      media_type="application/json").json()
    openapi("POST", "/api/requests/{id}/submit/", path_parameters={"id": created["id"]}, body={},
            media_type="application/json")
    step = BackfillRequest.objects.get(pk=created["id"]).approval_steps.get()
    before = AuditEvent.objects.count()
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 200
    response = openapi("POST", "/api/approvals/{id}/approve/", path_parameters={"id": step.pk},
                       body={"comment": "c" * 400}, media_type="application/json", as_="olivia")
    assert response.status_code == 413
    step.refresh_from_db()
    assert step.status == "pending"
    assert AuditEvent.objects.count() == before


def test_a_page_form_over_the_upload_limit_is_a_400_not_a_500(personas, catalog):
    client = Client()
    client.force_login(personas["alice"])
    response = client.post("/requests/new/", {"job": "dwd_order_items", "reason": "r" * 3 * 1024 * 1024})
    assert response.status_code == 400
    assert b"could not read this request" in response.content  # the portal's 400 page, not Django's bare one
    many = {f"f{i}": "x" for i in range(1500)}  # over DATA_UPLOAD_MAX_NUMBER_FIELDS
    response = client.post("/requests/new/", many)
    assert response.status_code == 400 and b"Traceback" not in response.content
    assert not BackfillRequest.objects.exists()


# -- 4. schema drift ------------------------------------------------------------------------

def test_the_rollback_get_answer_matches_its_schema(openapi, catalog):
    created = openapi("POST", "/api/requests/", body={"job": "dwd_order_items", "start": "2022-10-01",
                                                      "end": "2022-10-02", "reason": "schema"},
                      media_type="application/json")
    assert created.status_code == 201, created.text
    response = openapi("GET", "/api/requests/{id}/rollback/", path_parameters={"id": created.json()["id"]},
                       as_="audrey")
    assert response.status_code == 200
    assert response.json()["rolled_back"] == [] and response.json()["consumers"] == []


def test_a_conflict_and_a_refusal_match_the_documented_error_body(openapi, catalog):
    created = openapi("POST", "/api/requests/", body={"job": "dwd_order_items", "start": "2022-10-01",
                                                      "end": "2022-10-02", "reason": "errors"},
                      media_type="application/json").json()
    # 409: a draft has nothing to reconcile; 403: an auditor changes nothing; 400: a bad field.
    assert openapi("GET", "/api/requests/{id}/reconciliation/", path_parameters={"id": created["id"]}).status_code == 409
    assert openapi("POST", "/api/requests/{id}/cancel/", path_parameters={"id": created["id"]}, body={},
                   media_type="application/json", as_="audrey").status_code == 403
    bad = openapi("POST", "/api/requests/", body={"job": "dwd_order_items", "start": "2022-10-01", "end": "x",
                                                  "reason": "r", "max_active_intervals": 0},
                  media_type="application/json")
    assert bad.status_code == 400
    assert "max_active_intervals" in bad.json()["errors"]


def test_every_operation_documents_its_error_answers(openapi):
    doc = openapi.schema.raw_schema
    assert set(doc["components"]["schemas"]["Error"]["required"]) == {"detail"}
    for path, operations in doc["paths"].items():
        if path.startswith("/api/auth/"):
            continue  # the token endpoints document their own refusals (tests/governance/test_api_tokens.py)
        for method, operation in operations.items():
            expected = {"400", "401", "403", "404"} | ({"409", "413"} if method != "get" else set())
            assert expected <= set(operation["responses"]), (method, path, sorted(operation["responses"]))
            for code in expected:
                for content in operation["responses"][code]["content"].values():
                    # The shared Error body, or a view's own one that also leads with `detail`.
                    component = content["schema"]["$ref"].rsplit("/", 1)[-1]
                    assert "detail" in doc["components"]["schemas"][component]["required"], (method, path, code)
            for parameter in operation.get("parameters", []):
                if parameter["in"] == "path" and parameter["name"] == "id":
                    assert parameter["schema"]["type"] == "integer", (method, path)
    assert json.dumps(doc).count("RequestRollbackState") >= 2


def test_a_body_that_is_not_json_is_a_400_with_a_code(api, db):
    # DRF's ParseError answered {"detail"} alone, which the token endpoint's schema refuses.
    for client, path in ((Client(), "/api/auth/token/"), (api("alice"), "/api/requests/")):
        response = client.post(path, data="{not json", content_type="application/json")
        assert response.status_code == 400, (path, response.content)
        assert response.json()["code"] == "parse_error"
        assert response.json()["detail"].startswith("JSON parse error")


@pytest.mark.parametrize("depth", [33, 400, 5000])
def test_a_body_nested_too_deep_is_a_400_not_a_500(api, db, depth):
    """Python's JSON decoder recurses once a level: 5,000 levels exhaust the recursion
    limit while decoding, 400 did so in the NUL check that walked the parsed body."""
    nested = "[" * depth + "]" * depth
    for client, path, body in ((Client(), "/api/auth/token/", nested),
                               (api("alice"), "/api/requests/", '{"job": ' + nested + "}")):
        response = client.post(path, data=body, content_type="application/json")
        assert response.status_code == 400, (path, response.content)
        assert response.json()["code"] == "parse_error"
        assert "nested deeper than 32 levels" in response.json()["detail"]
    assert not BackfillRequest.objects.exists()


def test_a_body_nested_as_deep_as_allowed_is_parsed(api, db):
    nested = "[" * 31 + "]" * 31  # 32 levels with the object around it
    response = api("alice").post("/api/requests/", data='{"job": ' + nested + "}", content_type="application/json")
    assert response.status_code == 400
    assert response.json()["code"] != "parse_error", response.content  # refused by the serializer, not the parser


def test_every_link_of_the_api_root_answers_json(api, db):
    """The API's route names are its own: the pages' `request-list` and `run-list` once
    took the root's links to the HTML pages."""
    client = api("alice")
    links = client.get("/api/").json()
    assert {"requests", "runs", "datasets", "jobs", "audit", "approvals", "handoffs"} <= set(links)
    for name, url in links.items():
        assert "/api/" in url, (name, url)
        response = client.get(url)
        assert response.status_code == 200, (name, url)
        assert response["Content-Type"].startswith("application/json"), (name, url)


@pytest.mark.parametrize(("field", "value", "where"), [("side_effects", [None], "side_effects.0"),
                                                     ("exclude_stale", {"x": "y"}, "exclude_stale")])
def test_a_nested_field_error_is_a_plain_message_naming_the_item(api, catalog, field, value, where):
    body = {"job": "dwd_order_items", "start": "2022-10-01", "end": "2022-10-02", "reason": "r", field: value}
    response = api("alice").post("/api/requests/", data=body, content_type="application/json")
    assert response.status_code == 400, response.content
    detail = response.json()["detail"]
    assert detail.startswith(where), detail
    assert "ErrorDetail" not in detail and "{" not in detail, detail
    assert not BackfillRequest.objects.exists()


@pytest.mark.parametrize("action", ["rollback", "cancel", "signoff", "intervals/2022-10-01/explain"])
def test_an_action_on_a_request_that_does_not_exist_is_a_404_whatever_the_body(api, db, action):
    response = api("oscar").post(f"/api/requests/999999/{action}/", data={}, content_type="application/json")
    assert response.status_code == 404, response.content
    assert response.json()["code"] == "not_found"


def test_no_credentials_is_a_401_with_a_code(db):
    # DRF's NotAuthenticated answered {"detail"} alone, which the revoke endpoint's schema refuses.
    for path in ("/api/auth/token/revoke/", "/api/requests/1/cancel/"):
        response = Client().post(path, data={}, content_type="application/json")
        assert response.status_code == 401, (path, response.content)
        assert response.json()["code"] == "not_authenticated"


# -- 5. an over-long partition key or dataset name: the refusal's audit row overflowed ------

@pytest.mark.parametrize("key", ["2022-10-04" * 7, "k" * 500])
def test_an_over_long_partition_key_is_a_404_not_a_500(api, catalog, key):
    before = AuditEvent.objects.count()
    for method, suffix in [("get", ""), ("post", "rollback/"), ("post", "rollback/rebuild/")]:
        response = getattr(api("alice"), method)(f"/api/datasets/dwd_order_items/partitions/{key}/{suffix}",
                                                 {"reason": "x"}, format="json")
        assert response.status_code == 404, (suffix, response.status_code, response.content[:200])
    assert AuditEvent.objects.count() == before  # refused at the router: nothing to audit


def test_a_refusal_naming_the_longest_dataset_name_and_key_is_audited_whole(api, catalog):
    name, key = "d" * 128, "2022-10-04T05:00:00+08:00"
    response = api("alice").post(f"/api/datasets/{name}/partitions/{key}/rollback/rebuild/", {}, format="json")
    assert response.status_code in (403, 404), (response.status_code, response.content[:200])
    refusal = AuditEvent.objects.filter(action__startswith="denied.").order_by("-id").first()
    if response.status_code == 403:
        assert refusal.object_id == f"{name}/{key}"


# -- 6. with DEBUG on, an unmatched /api/ URL answered Django's HTML debug page ---------------

@pytest.mark.parametrize("path", ["/api/nothing/", "/api/requests/abc/", "/api/requests/1/no_such_action/",
                                  "/api/datasets/dwd_order_items/partitions/" + "k" * 500 + "/"])
def test_with_debug_on_every_404_under_the_api_is_still_the_json_error_body(api, catalog, settings, path):
    settings.DEBUG = True  # as `make run` has it; handler404 alone covers DEBUG off
    for client in (api("alice"), Client()):  # signed in or not: the URL matches nothing either way
        response = client.get(path)
        assert response.status_code == 404, (path, response.status_code)
        assert content_type(response).startswith("application/json"), (path, response.content[:200])
        assert response.json() == {"detail": "Not found.", "code": "not_found"}



@pytest.mark.parametrize("position", ["abc", "1e400", "2022-01-01", "-5", "9" * 30, "1.5"])
@pytest.mark.parametrize("path", ["/api/runs/", "/api/requests/", "/api/audit/"])
def test_a_cursor_whose_position_is_not_an_id_is_a_404_not_a_500(api, path, position):
    """The exploratory test: DRF hands the cursor's position to the filter as it is, so a
    hand-edited cursor (`p=abc`, base64) was a 500 on every paginated list."""
    import base64

    for raw in (f"p={position}", f"r=1&p={position}"):
        cursor = base64.b64encode(raw.encode()).decode()
        response = api("audrey").get(path, {"cursor": cursor})
        assert response.status_code == 404, (raw, response.content[:200])
        assert response.json()["detail"] == "Invalid cursor"
    # A real cursor still pages.
    good = base64.b64encode(b"p=5").decode()
    assert api("audrey").get(path, {"cursor": good}).status_code == 200


@pytest.mark.parametrize("path, param", [("/api/datasets/", "is_source"), ("/api/jobs/", "depends_on_past"),
                                         ("/api/jobs/", "scheduled")])
def test_a_boolean_filter_reads_true_or_false_and_refuses_anything_else(api, catalog, path, param):
    """The exploratory test: `?is_source=maybe` answered the whole unfiltered list."""
    def names(value):
        response = api("audrey").get(path, {param: value})
        assert response.status_code == 200, response.content[:300]
        return {item["name"] for item in response.json()["results"]}

    everything = names("")
    yes, no = names("true"), names("false")
    assert yes | no == everything and not yes & no
    assert names("1") == yes and names("0") == no
    for bad in ("maybe", "yes!", "2"):
        response = api("audrey").get(path, {param: bad})
        assert response.status_code == 400, bad
        assert param in response.json()["errors"]


def test_a_request_for_a_source_dataset_says_it_is_a_source(api, catalog):
    """The exploratory test: job=ods_order_events was refused as if it did not exist."""
    body = {"job": "ods_order_events", "start": "2022-10-01", "end": "2022-10-01", "reason": "try"}
    response = api("alice").post("/api/requests/", body, format="json")
    assert response.status_code == 400
    assert response.json()["errors"]["job"] == [
        "'ods_order_events' is a source dataset: it is read as it arrives, no job produces it, so it is not backfilled"]
    body["job"] = "no_such_job"
    assert api("alice").post("/api/requests/", body, format="json").json()["errors"]["job"] == [
        "job 'no_such_job' does not exist"]


@pytest.mark.parametrize("path, param", [("/api/runs/", "page_size"), ("/api/audit/", "page_size"),
                                         ("/api/datasets/", "limit"), ("/api/datasets/", "offset")])
def test_a_page_size_limit_or_offset_that_is_not_a_whole_number_is_a_400_naming_it(openapi, catalog, path, param):
    """The exploratory test: `page_size=0`, `-1` or `abc` quietly gave the default page
    (DRF's paginators read what they cannot use as the default)."""
    smallest = "0" if param == "offset" else "1"
    for bad in ("abc", "-1", "1.5", "9" * 30, "" if param != "offset" else "x") + (("0",) if param != "offset" else ()):
        response = openapi("GET", path, query={param: bad}, as_="audrey")
        assert response.status_code == 400, (bad, response.status_code, response.text[:200])
        assert param in response.json()["errors"], response.json()
    response = openapi("GET", path, query={param: smallest}, as_="audrey")
    assert response.status_code == 200, response.text[:300]
    if param in ("page_size", "limit"):
        assert len(response.json()["results"]) <= 1
        big = openapi("GET", path, query={param: "100000"}, as_="audrey")  # past the largest page: the largest
        assert big.status_code == 200


@pytest.mark.parametrize("path", ["/api/requests/", "/api/approvals/", "/api/handoffs/"])
def test_mine_is_documented_and_reads_true_or_false(openapi, catalog, path):
    schema = openapi.schema.raw_schema["paths"][path]["get"]
    assert "mine" in {p["name"] for p in schema["parameters"]}
    for good in ("1", "true", "0", "false"):
        assert openapi("GET", path, query={"mine": good}, as_="alice").status_code == 200, good
    response = openapi("GET", path, query={"mine": "maybe"}, as_="alice")
    assert response.status_code == 400 and "mine" in response.json()["errors"]


LIST_PATHS = ["/api/requests/", "/api/runs/", "/api/audit/", "/api/approvals/", "/api/handoffs/", "/api/datasets/",
              "/api/jobs/"]


@pytest.mark.parametrize("path", LIST_PATHS)
def test_a_list_refuses_a_query_parameter_it_does_not_take_naming_the_ones_it_does(openapi, catalog, path):
    """The scale QA: `?stauts=failed` answered every run, and an auditor's `?actr=bob`
    the whole log, as if filtered. What a list takes is what its schema documents."""
    documented = {p["name"] for p in openapi.schema.raw_schema["paths"][path]["get"]["parameters"]}
    response = openapi("GET", path, query={"stauts": "failed", "format": "json"}, as_="audrey", validate=False)
    assert response.status_code == 400, response.text[:300]
    message = response.json()["errors"]["stauts"][0]
    assert message.startswith("is not a query parameter of this list; it takes ")
    assert set(message.rsplit("it takes ", 1)[1].split(", ")) - {"format"} == documented
    assert openapi("GET", path, query={"format": "json"}, as_="audrey").status_code == 200


def test_a_multipart_body_that_cannot_be_parsed_is_a_400(personas, catalog):
    client = Client()
    client.force_login(personas["alice"])
    response = client.post("/requests/new/", b"--x\r\nbroken", content_type="multipart/form-data; boundary=")
    assert response.status_code == 400, response.status_code
    response = client.post("/api/requests/", b"--x\r\nbroken", content_type="multipart/form-data; boundary=")
    assert response.status_code == 400  # DRF's parse error
