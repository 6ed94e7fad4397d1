#!/usr/bin/env python
"""Django's command-line utility for Backfill Portal."""
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

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
