#!/usr/bin/env python
"""Django's command-line utility for Backfill Portal.

A failure is one line on stderr and a non-zero exit, never a traceback (`--traceback`
shows it): the project's commands do this themselves (core/management/base.py); here,
a bad setting and whatever Django's own commands raise get the same one line."""
import os
import sys


def main():
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "backfill_portal.settings")
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line

    try:
        settings.INSTALLED_APPS  # noqa: B018 (loads the settings)
    except ImproperlyConfigured as exc:
        # A bad or missing environment value: one line for the operator, no traceback.
        sys.exit(f"configuration error: {exc}")

    try:
        execute_from_command_line(sys.argv)
    except Exception as exc:
        if "--traceback" in sys.argv:
            raise
        from backfill_portal.core.management.base import describe_failure

        sys.exit(f"error: {describe_failure(exc)}")


if __name__ == "__main__":
    main()
