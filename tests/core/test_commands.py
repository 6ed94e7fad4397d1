"""Every management command fails with one clear line on stderr and a non-zero exit,
never a traceback: run as a person would, in a subprocess, against its own var dir."""
from __future__ import annotations

import importlib
import os
import pkgutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from django.apps import apps

from backfill_portal.core.management.base import PortalCommand

ROOT = Path(__file__).resolve().parents[2]
PG = os.environ.get("DATABASE_URL", "").startswith("postgres")


def manage(var_dir: Path, *args: str, timeout: int = 120, **env: str) -> subprocess.CompletedProcess:
    # The embedded defaults in a fresh var dir, plus what the test sets.
    dropped = ("DATABASE_URL", "WAREHOUSE_URL", "CELERY_BROKER_URL", "DJANGO_ALLOW_ASYNC_UNSAFE")
    full = {k: v for k, v in os.environ.items() if k not in dropped}
    full.update(BACKFILL_VAR_DIR=str(var_dir), **env)
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=full, capture_output=True,
                          text=True, timeout=timeout)


def one_clear_line(result: subprocess.CompletedProcess, *phrases: str) -> str:
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr + result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for phrase in phrases:
        assert phrase in lines[0]
    return lines[0]


@pytest.fixture
def var_dir(tmp_path):
    """A var dir whose metadata database is migrated."""
    result = manage(tmp_path, "migrate", "--noinput", "-v0")
    assert result.returncode == 0, result.stderr
    return tmp_path


def users_in(var_dir: Path) -> int:
    with sqlite3.connect(var_dir / "portal.sqlite3") as db:
        return db.execute("SELECT count(*) FROM auth_user").fetchone()[0]


def test_load_demo_with_an_unreachable_warehouse_prints_one_line_and_writes_nothing(var_dir):
    result = manage(var_dir, "load_demo", WAREHOUSE_URL=f"sqlite:///{var_dir}/no/such/dir/warehouse.sqlite3")
    assert one_clear_line(result, "cannot connect to the warehouse").startswith("CommandError: ")
    assert users_in(var_dir) == 0  # the warehouse is reached before anything is written


@pytest.mark.skipif(not PG, reason="needs the PostgreSQL server of CI's second pass (DATABASE_URL=postgres://...)")
def test_load_demo_with_a_missing_postgresql_warehouse_database_prints_one_line(var_dir):
    result = manage(var_dir, "load_demo", "--no-data",
                    WAREHOUSE_URL="postgresql://postgres@127.0.0.1:5432/bf_no_such_warehouse_db")
    one_clear_line(result, "cannot connect to the warehouse", 'database "bf_no_such_warehouse_db" does not exist')
    assert users_in(var_dir) == 0


def test_a_command_before_migrate_says_to_migrate(tmp_path):
    one_clear_line(manage(tmp_path, "verify_audit"), "metadata database", "is not set up", "manage.py migrate")
    # ... and leaves no empty database file behind (the exploratory test found one).
    assert not (tmp_path / "portal.sqlite3").exists()


def test_a_metadata_database_that_cannot_be_opened_is_one_line_for_django_commands_too(tmp_path):
    url = f"sqlite:///{tmp_path}/no/such/dir/portal.sqlite3"
    one_clear_line(manage(tmp_path, "migrate", DATABASE_URL=url), "error: cannot use the metadata database",
                   "unable to open database file")
    one_clear_line(manage(tmp_path, "verify_audit", DATABASE_URL=url), "CommandError: the metadata database",
                   "is not set up: there is no such file")


@pytest.mark.skipif(not PG, reason="needs the PostgreSQL server of CI's second pass (DATABASE_URL=postgres://...)")
def test_a_missing_postgresql_metadata_database_is_one_line_without_its_password(tmp_path):
    result = manage(tmp_path, "verify_audit", DATABASE_URL="postgres://postgres:s3cret@127.0.0.1:5432/bf_no_such_db")
    line = one_clear_line(result, "postgres:***@127.0.0.1:5432/bf_no_such_db", "does not exist")
    assert "s3cret" not in line


def test_sync_catalog_with_a_bad_file_prints_one_line(var_dir):
    broken = var_dir / "broken.yaml"
    broken.write_text("datasets: [1\n")
    one_clear_line(manage(var_dir, "sync_catalog", str(broken)), str(broken), "not valid YAML")
    invalid = var_dir / "invalid.yaml"
    invalid.write_text("datasets:\n  - name: x\njobs:\n  - name: y\n")
    one_clear_line(manage(var_dir, "sync_catalog", str(invalid)), str(invalid))
    one_clear_line(manage(var_dir, "sync_catalog", str(var_dir / "missing.yaml")), "No such file or directory")


def test_a_bad_setting_is_one_line_before_any_command_runs(tmp_path):
    one_clear_line(manage(tmp_path, "load_demo", DEBUG="maybe"), "configuration error: DEBUG='maybe' is not a boolean")


def test_traceback_is_still_there_when_asked_for(tmp_path):
    result = manage(tmp_path, "verify_audit", "--traceback")
    assert result.returncode != 0 and "Traceback" in result.stderr


def test_run_portal_whose_web_server_cannot_start_stops_the_rest_and_exits_non_zero(var_dir):
    result = manage(var_dir, "run_portal", "--addr", "not-a-port", timeout=90)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr + result.stdout
    assert result.stderr.strip().splitlines()[-1] == "CommandError: the web process exited with 1; stopped the others"


def test_every_project_command_is_a_portal_command():
    found = []
    for app in (config.name for config in apps.get_app_configs() if config.name.startswith("backfill_portal.")):
        try:
            package = importlib.import_module(f"{app}.management.commands")
        except ModuleNotFoundError:
            continue
        for info in pkgutil.iter_modules(package.__path__):
            command = importlib.import_module(f"{package.__name__}.{info.name}").Command
            assert issubclass(command, PortalCommand), info.name
            found.append(info.name)
    assert {"load_demo", "sync_catalog", "verify_audit", "run_portal"} <= set(found)
