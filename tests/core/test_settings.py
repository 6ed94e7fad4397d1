"""How a database URL becomes Django's connection settings."""
from __future__ import annotations

import re

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connection

from backfill_portal.settings import database_config, process_kind

PG = "postgres://portal@db:5432/portal"
DEAD_PEER = "-c tcp_keepalives_idle=30 -c tcp_keepalives_interval=6 -c tcp_keepalives_count=5"


@pytest.fixture(autouse=True)
def default_dead_peer(monkeypatch):
    monkeypatch.delenv("DATABASE_DEAD_PEER_SECONDS", raising=False)


def test_postgresql_reuses_checked_connections_and_prepares_repeated_statements(monkeypatch):
    monkeypatch.delenv("DATABASE_PREPARED", raising=False)
    monkeypatch.delenv("DATABASE_CONN_MAX_AGE", raising=False)
    config = database_config(PG)
    assert config["CONN_MAX_AGE"] == 300 and config["CONN_HEALTH_CHECKS"] is True
    assert config["OPTIONS"] == {"server_side_binding": True, "prepare_threshold": 5, "options": DEAD_PEER}


def test_options_given_in_the_url_are_kept(monkeypatch):
    monkeypatch.delenv("DATABASE_PREPARED", raising=False)
    config = database_config(PG + "?sslmode=require&options=-c%20statement_timeout%3D5000")
    assert config["OPTIONS"] == {"sslmode": "require", "server_side_binding": True, "prepare_threshold": 5,
                                 "options": "-c statement_timeout=5000 " + DEAD_PEER}


def test_the_server_is_asked_to_end_a_session_whose_peer_is_gone_within_the_seconds_given(monkeypatch):
    """A worker host cut off inside a transaction holds the dispatch lock and the audit
    chain: the server's own keepalives end its session within about N seconds."""
    monkeypatch.setenv("DATABASE_DEAD_PEER_SECONDS", "20")
    assert database_config(PG)["OPTIONS"]["options"] == (
        "-c tcp_keepalives_idle=10 -c tcp_keepalives_interval=2 -c tcp_keepalives_count=5")
    monkeypatch.setenv("DATABASE_DEAD_PEER_SECONDS", "0")  # behind PgBouncer, which refuses startup options
    assert "options" not in database_config(PG)["OPTIONS"]
    monkeypatch.setenv("DATABASE_DEAD_PEER_SECONDS", "-1")
    with pytest.raises(ImproperlyConfigured, match="DATABASE_DEAD_PEER_SECONDS='-1' must be at least 0"):
        database_config(PG)


def test_both_can_be_switched_off_for_a_pooler(monkeypatch):
    monkeypatch.setenv("DATABASE_PREPARED", "0")
    monkeypatch.setenv("DATABASE_CONN_MAX_AGE", "0")
    config = database_config(PG)
    assert config["CONN_MAX_AGE"] == 0
    assert "server_side_binding" not in config.get("OPTIONS", {})


def test_sqlite_keeps_its_own_options(monkeypatch):
    monkeypatch.delenv("DATABASE_PREPARED", raising=False)
    config = database_config("sqlite:////tmp/x.sqlite3")
    assert config["OPTIONS"]["transaction_mode"] == "IMMEDIATE"
    assert "server_side_binding" not in config["OPTIONS"] and "options" not in config["OPTIONS"]


@pytest.mark.django_db
def test_the_live_postgresql_connection_prepares_statements():
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL only (DATABASE_URL)")
    connection.ensure_connection()
    assert connection.connection.prepare_threshold == 5


@pytest.mark.django_db
def test_the_live_postgresql_session_carries_the_dead_peer_keepalives():
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL only (DATABASE_URL)")
    if not (connection.settings_dict["HOST"] or "").strip() or connection.settings_dict["HOST"].startswith("/"):
        pytest.skip("keepalives are TCP's: this DATABASE_URL uses a Unix socket")
    with connection.cursor() as cursor:
        cursor.execute("SELECT name, setting::int FROM pg_settings WHERE name LIKE 'tcp_keepalives%%'")
        live = dict(cursor.fetchall())
    assert settings.DATABASE_DEAD_PEER_SETTINGS, "the suite runs with DATABASE_DEAD_PEER_SECONDS=0"
    assert live == settings.DATABASE_DEAD_PEER_SETTINGS


@pytest.mark.parametrize("argv, kind", [
    (["/srv/.venv/bin/gunicorn", "backfill_portal.wsgi:application", "--threads", "8"], "web"),
    (["/srv/.venv/lib/python3.11/site-packages/gunicorn/__main__.py", "backfill_portal.wsgi"], "web"),
    (["manage.py", "runserver", "127.0.0.1:8000", "--noreload"], "web"),
    (["/srv/.venv/bin/celery", "-A", "backfill_portal", "worker", "-Q", "production,backfill"], "worker"),
    (["/srv/.venv/lib/python3.11/site-packages/celery/__main__.py", "-A", "backfill_portal", "worker"], "worker"),
    (["/srv/.venv/bin/celery", "-A", "backfill_portal", "beat"], "command"),
    (["manage.py", "migrate", "--noinput"], "command"),
    (["manage.py", "run_portal"], "command"),
    (["manage.py", "shell", "-c", "runserver"], "command"),
    (["/srv/.venv/bin/pytest", "-q"], "command"),
    ([], "command"),
])
def test_each_process_is_told_apart_by_how_it_was_started(argv, kind):
    assert process_kind(argv) == kind


def test_web_and_worker_processes_on_postgresql_take_connections_from_a_bounded_pool(monkeypatch):
    monkeypatch.delenv("DATABASE_POOL_MAX_SIZE", raising=False)
    monkeypatch.delenv("DATABASE_POOL_TIMEOUT", raising=False)
    for process in ("web", "worker"):
        config = database_config(PG, process)
        assert config["CONN_MAX_AGE"] == 0  # Django refuses a pool with persistent connections
        assert config["OPTIONS"]["pool"] == {"min_size": 1, "max_size": 4, "timeout": 10.0,
                                             "name": f"metadata-{process}"}
        assert config["OPTIONS"]["prepare_threshold"] == 5
    monkeypatch.setenv("DATABASE_POOL_MAX_SIZE", "12")
    monkeypatch.setenv("DATABASE_POOL_TIMEOUT", "2.5")
    assert database_config(PG, "web")["OPTIONS"]["pool"]["max_size"] == 12
    assert database_config(PG, "web")["OPTIONS"]["pool"]["timeout"] == 2.5


def test_management_commands_connect_directly_so_a_missing_database_fails_at_once(monkeypatch):
    monkeypatch.delenv("DATABASE_CONN_MAX_AGE", raising=False)
    config = database_config(PG, "command")
    assert "pool" not in config["OPTIONS"] and config["CONN_MAX_AGE"] == 300


def test_no_pool_when_switched_off_or_on_sqlite(monkeypatch):
    assert "pool" not in database_config("sqlite:////tmp/x.sqlite3", "web")["OPTIONS"]
    monkeypatch.setenv("DATABASE_POOL_MAX_SIZE", "0")
    monkeypatch.delenv("DATABASE_CONN_MAX_AGE", raising=False)
    config = database_config(PG, "web")
    assert "pool" not in config["OPTIONS"] and config["CONN_MAX_AGE"] == 300


@pytest.mark.parametrize("env, message", [
    ({"DATABASE_POOL_MAX_SIZE": "-1"}, "DATABASE_POOL_MAX_SIZE=-1 must be 0 (no pool) or more"),
    ({"DATABASE_POOL_MAX_SIZE": "four"}, "DATABASE_POOL_MAX_SIZE='four' is not an integer"),
    ({"DATABASE_POOL_TIMEOUT": "0"}, "DATABASE_POOL_TIMEOUT must be more than 0 seconds"),
    ({"DATABASE_POOL_TIMEOUT": "-3"}, "DATABASE_POOL_TIMEOUT='-3' must be zero or more"),
])
def test_bad_pool_settings_fail_loudly(monkeypatch, env, message):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ImproperlyConfigured, match=re.escape(message)):
        database_config(PG, "web")


def test_a_worker_pool_must_hold_a_task_and_its_heartbeat(monkeypatch):
    monkeypatch.setenv("DATABASE_POOL_MAX_SIZE", "1")
    assert database_config(PG, "web")["OPTIONS"]["pool"]["max_size"] == 1
    with pytest.raises(ImproperlyConfigured, match="too small for a worker: a task and its attempt's heartbeat need 2"):
        database_config(PG, "worker")


def test_the_suite_writes_run_logs_to_its_own_temporary_folder_and_processes_it_starts_do_too(run_log_dir):
    import os
    import subprocess
    import sys
    from pathlib import Path

    from django.conf import settings

    root = Path(__file__).resolve().parents[2]
    assert settings.RUN_LOG_DIR == run_log_dir == os.environ["RUN_LOG_DIR"]
    assert not Path(run_log_dir).resolve().is_relative_to(root)
    child = subprocess.run([sys.executable, "-c", "import django; django.setup(); from django.conf import settings; "
                            "print(settings.RUN_LOG_DIR)"], cwd=root, capture_output=True, text=True, timeout=120,
                           env={**os.environ, "DJANGO_SETTINGS_MODULE": "backfill_portal.settings"})
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == run_log_dir
