"""The PostgreSQL side of the audit log's protection: the triggers' names and the
least-privilege role the application connects as (docs/security.md).

Two roles: the *owner* runs migrations and owns every table (and so could disable a
trigger); the *application* role, which web, workers and scheduler use, owns nothing.
It may read and write the portal's tables, but on the audit table only SELECT and
INSERT: no UPDATE, DELETE or TRUNCATE, and, owning nothing, no ALTER TABLE ... DISABLE
TRIGGER. `manage.py app_role_sql` prints these statements for a deployment.
"""
from __future__ import annotations

import re

from backfill_portal.core.models import AuditEvent

AUDIT_TABLE = AuditEvent._meta.db_table
# Row-level (UPDATE, DELETE; migration 0002) and statement-level (TRUNCATE; 0004).
AUDIT_TRIGGERS = ("core_auditevent_append_only", "core_auditevent_no_truncate")
TRUNCATE_TRIGGER = AUDIT_TRIGGERS[1]

_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")


def app_role_sql(*, role: str, owner: str, database: str, password: str | None = None,
                 schema: str = "public") -> list[str]:
    """The statements that create the application's role, to be run by the owner (or a
    superuser) in the portal's metadata database after `migrate`. Names are checked,
    not quoted: a lower-case identifier, as PostgreSQL folds them."""
    for label, name in (("role", role), ("owner", owner), ("database", database), ("schema", schema)):
        if not _NAME.fullmatch(name):
            raise ValueError(f"{label} {name!r} is not a plain lower-case PostgreSQL name")
    login = "LOGIN" + (" PASSWORD " + _literal(password) if password else "")
    return [
        f"CREATE ROLE {role} {login} NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS NOINHERIT",
        f"GRANT CONNECT ON DATABASE {database} TO {role}",
        f"REVOKE CREATE ON SCHEMA {schema} FROM PUBLIC",
        f"GRANT USAGE ON SCHEMA {schema} TO {role}",
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} TO {role}",
        f"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA {schema} TO {role}",
        f"REVOKE UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER ON {AUDIT_TABLE} FROM {role}",
        # Tables a later migration creates get the same grants (the audit table exists already).
        f"ALTER DEFAULT PRIVILEGES FOR ROLE {owner} IN SCHEMA {schema} "
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {role}",
        f"ALTER DEFAULT PRIVILEGES FOR ROLE {owner} IN SCHEMA {schema} GRANT USAGE, SELECT ON SEQUENCES TO {role}",
    ]


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"
