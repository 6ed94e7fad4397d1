"""/healthz answers without touching anything; /readyz checks the database, the
warehouse and the broker for real and names the one that is down (503, JSON)."""
from __future__ import annotations

import os

import pytest
from django.test import Client


def test_healthz_answers_without_a_database_query(db, django_assert_num_queries):
    with django_assert_num_queries(0):
        response = Client().get("/healthz")
    assert response.status_code == 200 and response.json() == {"status": "ok"}
    assert "no-cache" in response["Cache-Control"]


def test_readyz_is_200_when_database_warehouse_and_broker_answer(db, warehouse):
    response = Client().get("/readyz")
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["status"] == "ok" and body["failed"] == []
    assert body["checks"] == {"database": {"ok": True}, "warehouse": {"ok": True}, "broker": {"ok": True}}


def test_readyz_is_503_naming_an_unreachable_warehouse(db, settings, tmp_path):
    settings.WAREHOUSE_URL = "postgresql://postgres@127.0.0.1:1/nowhere"  # nothing listens on port 1
    response = Client().get("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "unavailable" and body["failed"] == ["warehouse"]
    assert body["checks"]["warehouse"]["ok"] is False and "OperationalError" in body["checks"]["warehouse"]["error"]
    assert body["checks"]["database"] == {"ok": True}
    # A SQLite warehouse whose file is gone is down too (not silently created anew).
    settings.WAREHOUSE_URL = f"sqlite:///{tmp_path / 'missing.sqlite3'}"
    assert Client().get("/readyz").json()["failed"] == ["warehouse"]
    assert not (tmp_path / "missing.sqlite3").exists()


def test_readyz_is_503_naming_an_unreachable_broker(db, settings, warehouse):
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:1/0"
    settings.HEALTH_CHECK_TIMEOUT = 1
    response = Client().get("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert body["failed"] == ["broker"] and body["checks"]["warehouse"] == {"ok": True}
    assert body["checks"]["broker"]["error"]


@pytest.mark.skipif(not os.environ.get("CELERY_BROKER_URL", "").startswith("redis"),
                    reason="needs CELERY_BROKER_URL=redis://... (CI's second pass)")
def test_readyz_reaches_the_configured_redis(db, warehouse):
    assert Client().get("/readyz").json()["checks"]["broker"] == {"ok": True}


def test_another_method_on_the_probes_is_a_405_not_the_csrf_page(db):
    """The exploratory deploy test: POST /healthz got the 403 'Form expired' page."""
    client = Client(enforce_csrf_checks=True)
    for path in ("/healthz", "/readyz", "/metrics"):
        response = client.post(path)
        assert response.status_code == 405, path
        assert "GET" in response["Allow"]


def test_head_answers_on_the_probes_as_get_does(db):
    """The exploratory test: HAProxy's `httpchk HEAD` and uptime services probe with HEAD,
    which was a 405: the service would have been marked down."""
    client = Client()
    for path in ("/healthz", "/readyz", "/metrics"):
        get, head = client.get(path), client.head(path)
        assert head.status_code == get.status_code, path
        assert head.status_code in (200, 503), path
