"""How a database URL becomes Django's connection settings."""
from __future__ import annotations

import pytest
from django.db import connection

from backfill_portal.settings import _database

PG = "postgres://portal@db:5432/portal"


def test_postgresql_reuses_checked_connections_and_prepares_repeated_statements(monkeypatch):
    monkeypatch.delenv("DATABASE_PREPARED", raising=False)
    monkeypatch.delenv("DATABASE_CONN_MAX_AGE", raising=False)
    config = _database(PG)
    assert config["CONN_MAX_AGE"] == 300 and config["CONN_HEALTH_CHECKS"] is True
    assert config["OPTIONS"] == {"server_side_binding": True, "prepare_threshold": 5}


def test_options_given_in_the_url_are_kept(monkeypatch):
    monkeypatch.delenv("DATABASE_PREPARED", raising=False)
    config = _database(PG + "?sslmode=require")
    assert config["OPTIONS"] == {"sslmode": "require", "server_side_binding": True, "prepare_threshold": 5}


def test_both_can_be_switched_off_for_a_pooler(monkeypatch):
    monkeypatch.setenv("DATABASE_PREPARED", "0")
    monkeypatch.setenv("DATABASE_CONN_MAX_AGE", "0")
    config = _database(PG)
    assert config["CONN_MAX_AGE"] == 0
    assert "server_side_binding" not in config.get("OPTIONS", {})


def test_sqlite_keeps_its_own_options(monkeypatch):
    monkeypatch.delenv("DATABASE_PREPARED", raising=False)
    config = _database("sqlite:////tmp/x.sqlite3")
    assert config["OPTIONS"]["transaction_mode"] == "IMMEDIATE"
    assert "server_side_binding" not in config["OPTIONS"]


@pytest.mark.django_db
def test_the_live_postgresql_connection_prepares_statements():
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL only (DATABASE_URL)")
    connection.ensure_connection()
    assert connection.connection.prepare_threshold == 5
