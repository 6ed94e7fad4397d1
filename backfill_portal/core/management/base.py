"""What every project command shares: a failure is one clear line on stderr and a
non-zero exit, never a traceback (`--traceback` still shows one).

`PortalCommand` turns whatever its `handle` raises into a `CommandError` with
`describe_failure`'s line; Django prints that as `CommandError: <line>` and exits 1.
`manage.py` uses the same line for what fails before a command runs (a bad setting)
and for Django's own commands.
"""
from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError
from django.db import Error as DatabaseError

from backfill_portal.core.errors import ApplicationError, Unavailable

NOT_MIGRATED = re.compile(r"no such table|relation .* does not exist|no such column|column .* does not exist", re.I)


def one_line(text: str) -> str:
    """Collapse a multi-line driver message (psycopg's come with DETAIL/HINT lines)."""
    return re.sub(r"\s+", " ", str(text)).strip()


def redact_url(url: str) -> str:
    """A database URL without its password, fit to print."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


def _metadata_database() -> str:
    try:
        from django.conf import settings

        return f"the metadata database (DATABASE_URL={redact_url(settings.DATABASE_URL)})"
    except Exception:  # noqa: BLE001 - settings themselves may be what failed
        return "the metadata database (DATABASE_URL)"


def describe_failure(exc: BaseException) -> str:
    """One line that says what failed, for a person at a terminal."""
    if isinstance(exc, CommandError):
        return one_line(exc)
    if isinstance(exc, Unavailable):
        return one_line(exc)
    if isinstance(exc, ApplicationError):
        # Each field's problem once: not again when the message already names it.
        fields = "; ".join(f"{field}: {msg}" for field, msgs in exc.fields.items() for msg in msgs
                           if msg != exc.message and f"{field}: {msg}" not in exc.message)
        return one_line(exc.message + (f" ({fields})" if fields else ""))
    if isinstance(exc, ImproperlyConfigured):
        return one_line(f"configuration: {exc}")
    if isinstance(exc, DatabaseError):
        if NOT_MIGRATED.search(str(exc)):
            return one_line(f"{_metadata_database()} is not set up: {exc} (run `manage.py migrate`)")
        return one_line(f"cannot use {_metadata_database()}: {exc}")
    if isinstance(exc, OSError):
        where = f"{exc.filename}: " if getattr(exc, "filename", None) else ""
        return one_line(f"{where}{exc.strerror or exc}")
    text = one_line(exc) or "(no message)"
    return f"{type(exc).__name__}: {text} (rerun with --traceback for the details)"


def add_actor_arguments(parser, *, does: str) -> None:
    """`--actor USER --reason TEXT` of a command whose changes are audited: who `does` it
    and why (`actor_and_reason` checks them)."""
    parser.add_argument("--actor", default="", help=f"the portal user who {does} (audited as the actor)")
    parser.add_argument("--reason", default="", help="why: the change, ticket or deploy (audited)")


def actor_and_reason(actor: str, reason: str, *, does: str, changes: str):
    """The active portal user named by --actor and the stripped --reason, else a
    CommandError saying which is missing: every audit row names a person and a why."""
    from django.contrib.auth import get_user_model

    from backfill_portal.core.text import control_character_in, control_character_message

    if not actor.strip():
        raise CommandError(f"--actor is required: the portal user who {does} (audited as the actor, never 'system')")
    user = get_user_model().objects.filter(username=actor.strip(), is_active=True).first()
    if user is None:
        raise CommandError(f"--actor {actor.strip()!r} is not an active portal user")
    if not reason.strip():
        raise CommandError(f"--reason is required: say why {changes} (it is audited with every change)")
    code = control_character_in(reason)
    if code:
        raise CommandError(f"--reason: {control_character_message(code)}")
    return user, reason.strip()


def missing_sqlite_file() -> str | None:
    """The metadata database's file when it is SQLite and the file does not exist: the
    driver would create it, empty, as a side effect of a command that only reads."""
    from pathlib import Path

    from django.conf import settings

    database = settings.DATABASES["default"]
    name = str(database.get("NAME") or "")
    if database.get("ENGINE", "").endswith("sqlite3") and name and name != ":memory:" \
            and not name.startswith("file:") and not Path(name).exists():
        return name
    return None


class PortalCommand(BaseCommand):
    """Base of every project command (see the module docstring)."""

    def execute(self, *args, **options):
        missing = missing_sqlite_file()
        if missing:
            raise CommandError(f"the metadata database {missing} is not set up: there is no such file (run "
                               "`manage.py migrate`, or `make run`, first; or set DATABASE_URL)")
        try:
            return super().execute(*args, **options)
        except CommandError as exc:
            if options.get("traceback") or "\n" not in str(exc):
                raise
            raise CommandError(one_line(exc), returncode=exc.returncode) from exc
        except Exception as exc:
            if options.get("traceback"):
                raise
            raise CommandError(describe_failure(exc)) from exc
