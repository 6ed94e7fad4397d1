import os

from django.core.management.base import CommandError
from django.db import connection

from backfill_portal.core.dbroles import app_role_sql
from backfill_portal.core.management.base import PortalCommand


class Command(PortalCommand):
    help = ("Print the SQL that creates the application's least-privilege PostgreSQL role: it may read and "
            "write the portal's tables but only SELECT and INSERT the audit log, and owns nothing "
            "(docs/security.md). Run the output as the owner, after migrate.")

    def add_arguments(self, parser):
        parser.add_argument("--role", default="portal_app", help="the role the application will log in as")
        parser.add_argument("--owner", help="the role that owns the tables and runs migrate (default: DATABASE_URL's user)")
        parser.add_argument("--database", help="the metadata database (default: DATABASE_URL's)")
        parser.add_argument("--password-env", help="read the role's password from this environment variable")

    def handle(self, *args, role, owner, database, password_env, **options):
        if connection.vendor != "postgresql":
            raise CommandError("the application role is a PostgreSQL feature: set DATABASE_URL to the portal's database")
        password = None
        if password_env:
            password = os.environ.get(password_env)
            if not password:
                raise CommandError(f"--password-env {password_env}: that environment variable is empty or unset")
        db = connection.settings_dict
        try:
            statements = app_role_sql(role=role, owner=owner or db["USER"] or "postgres",
                                      database=database or db["NAME"], password=password)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write("\n".join(statement + ";" for statement in statements))
