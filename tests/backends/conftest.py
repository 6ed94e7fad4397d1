"""The warehouse backends' tests share one throwaway PostgreSQL database per session."""
from __future__ import annotations

import os
from urllib.parse import urlparse, urlunparse

import psycopg
import pytest

PG_ADMIN_URL = os.environ.get("WAREHOUSE_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


@pytest.fixture(scope="session")
def pg_url():
    """A throwaway database for this test session, dropped afterwards."""
    try:
        admin = psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5)
    except psycopg.Error as exc:
        pytest.skip(f"PostgreSQL not reachable at {PG_ADMIN_URL} ({exc}); set WAREHOUSE_TEST_PG_URL to point elsewhere")
    name = f"backfill_wh_test_{os.getpid()}"
    with admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield urlunparse(urlparse(PG_ADMIN_URL)._replace(path=f"/{name}"))
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
