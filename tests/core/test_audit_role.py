"""The application's least-privilege PostgreSQL role (docs/security.md), created in the
test exactly as `manage.py app_role_sql` prints it: it appends to and reads the audit
log, and is refused every statement that would rewrite it, including switching off the
triggers, which only an owner can do and it owns nothing."""
from __future__ import annotations

import os
import subprocess
import sys
import uuid
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connection

from backfill_portal.backfills.services.requests import backfill_request_create, backfill_request_submit
from backfill_portal.core.models import AuditEvent
from backfill_portal.core.services.audit import audit_check, audit_record

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="database roles are PostgreSQL's (DATABASE_URL)"),
]


def owner_settings() -> dict:
    db = connection.settings_dict
    return {"host": db["HOST"] or "127.0.0.1", "port": db["PORT"] or 5432, "dbname": db["NAME"]}


@pytest.fixture
def app_role(transactional_db):
    """A fresh role per test (roles are global to the PostgreSQL cluster), from the SQL
    the deployment runs, dropped afterwards with what was granted to it."""
    role = f"bf_app_{uuid.uuid4().hex[:10]}"
    out = StringIO()
    call_command("app_role_sql", role=role, stdout=out)
    with connection.cursor() as cursor:
        cursor.execute(out.getvalue())
    yield role
    with connection.cursor() as cursor:
        cursor.execute("RESET ROLE")
        cursor.execute(f"DROP OWNED BY {role}")
        cursor.execute(f"DROP ROLE {role}")


@pytest.fixture
def as_app_role(app_role):
    """A connection of its own, logged in as the application's role."""
    import psycopg

    with psycopg.connect(user=app_role, autocommit=True, **owner_settings()) as conn:
        assert conn.execute("SELECT current_user, session_user").fetchone() == (app_role, app_role)
        yield conn


REWRITES = [
    "UPDATE core_auditevent SET reason = 'rewritten'",
    "DELETE FROM core_auditevent",
    "TRUNCATE core_auditevent",
    "ALTER TABLE core_auditevent DISABLE TRIGGER ALL",
    "ALTER TABLE core_auditevent DISABLE TRIGGER core_auditevent_no_truncate",
    "DROP TRIGGER core_auditevent_append_only ON core_auditevent",
    "CREATE TRIGGER t BEFORE INSERT ON core_auditevent FOR EACH ROW EXECUTE FUNCTION core_auditevent_append_only()",
    "DROP TABLE core_auditevent",
    "ALTER TABLE core_auditevent RENAME TO old_auditevent",
    "CREATE TABLE public.core_auditevent_copy (id bigint)",
]


def test_the_app_role_is_refused_every_statement_that_rewrites_the_log(as_app_role):
    import psycopg

    for n in range(3):
        audit_record(actor=None, action="test.event", object_type="test", object_id=n)
    before = list(AuditEvent.objects.order_by("id").values_list("id", "hash"))
    allowed = []
    for sql in REWRITES:
        try:
            as_app_role.execute(sql)
        except psycopg.errors.InsufficientPrivilege:
            continue
        allowed.append(sql)
    assert allowed == []
    assert list(AuditEvent.objects.order_by("id").values_list("id", "hash")) == before
    assert audit_check().intact


def test_the_app_role_owns_nothing_and_has_no_power_over_the_triggers(as_app_role, app_role):
    owned = as_app_role.execute(
        """SELECT (SELECT count(*) FROM pg_class WHERE relowner = r.oid)
                + (SELECT count(*) FROM pg_namespace WHERE nspowner = r.oid)
                + (SELECT count(*) FROM pg_proc WHERE proowner = r.oid)
                + (SELECT count(*) FROM pg_type WHERE typowner = r.oid)
                + (SELECT count(*) FROM pg_database WHERE datdba = r.oid),
                  r.rolsuper, r.rolcreaterole, r.rolcreatedb, r.rolbypassrls, r.rolreplication,
                  pg_has_role(r.oid, (SELECT relowner FROM pg_class WHERE relname = 'core_auditevent'), 'USAGE')
           FROM pg_roles r WHERE r.rolname = %s""", [app_role]).fetchone()
    assert owned == (0, False, False, False, False, False, False)
    privileges = as_app_role.execute(
        "SELECT has_table_privilege('core_auditevent', p) FROM unnest(ARRAY"
        "['SELECT', 'INSERT', 'UPDATE', 'DELETE', 'TRUNCATE', 'REFERENCES', 'TRIGGER']) AS p").fetchall()
    assert [p for (p,) in privileges] == [True, True, False, False, False, False, False]


def test_the_portal_works_as_the_app_role(catalog, app_role, alice, audit_anchor_path):
    """The application, on the app role's privileges: a request filed and submitted
    through the service (its rows and audit events), the chain verified and anchored,
    and the management commands run by a process that logs in as the role."""
    with connection.cursor() as cursor:
        cursor.execute(f"SET ROLE {app_role}")
    try:
        request, _ = backfill_request_create(actor=alice, job="dwd_order_items", start="2022-10-01",
                                             end="2022-10-03", reason="as the app role")
        backfill_request_submit(actor=alice, request_id=request.pk)
        audit_record(actor=alice, action="test.as_app_role", object_type="test", object_id=1)
        with connection.cursor() as cursor:
            cursor.execute("SELECT current_user")
            assert cursor.fetchone() == (app_role,)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET ROLE")
    assert {"request.create", "request.submit"} <= set(
        AuditEvent.objects.filter(request_id=request.pk).values_list("action", flat=True))

    db = owner_settings()
    env = {**os.environ, "DATABASE_URL": f"postgres://{app_role}@{db['host']}:{db['port']}/{db['dbname']}",
           "AUDIT_ANCHOR_PATH": str(audit_anchor_path)}
    for command, expected in (("anchor_audit", "audit anchored"), ("verify_audit", "audit log intact")):
        result = subprocess.run([sys.executable, "manage.py", command], cwd=ROOT, env=env, capture_output=True,
                                text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        assert expected in result.stdout
    assert f"matches its anchor" in result.stdout
