"""The example dbt project (docs/examples/dbt_shop), copied per test so a test may edit
its models, and its source table loaded into the test's warehouse."""
from __future__ import annotations

import io
import re
import os
import shutil
from pathlib import Path

import pytest
from django.core.management import call_command

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "dbt_shop"
ON_POSTGRES = os.environ.get("WAREHOUSE_URL", "").startswith("postgres")
postgres_only = pytest.mark.skipif(not ON_POSTGRES, reason="dbt runs on a PostgreSQL warehouse "
                                   "(WAREHOUSE_URL=postgresql://..., CI's second pass)")


@pytest.fixture
def dbt_shop(tmp_path) -> Path:
    project = tmp_path / "dbt_shop"
    shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns("target", "logs"))
    return project


@pytest.fixture
def shop_orders(warehouse_url):
    """raw_orders in the test's warehouse, from the example's own SQL file."""
    import psycopg

    with psycopg.connect(warehouse_url.replace("postgresql://", "postgres://", 1), autocommit=True) as conn:
        conn.execute((EXAMPLE / "raw_orders.sql").read_text(encoding="utf-8"))
    return warehouse_url


SYNC_REASON = "deploy of the dbt_shop models"


def sync_dbt(*args, actor: str = "olivia", reason: str = SYNC_REASON) -> list[str]:
    """`manage.py sync_dbt ARGS --actor olivia --reason ...`: its output's lines."""
    out = io.StringIO()
    call_command("sync_dbt", *[str(a) for a in args], "--actor", actor, "--reason", reason, stdout=out)
    return out.getvalue().splitlines()


def summary(lines: list[str]) -> str:
    """The "N created, N changed, N unchanged" line."""
    return next(line for line in lines if re.match(r"^\d+ created, ", line))
