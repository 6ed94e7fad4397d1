"""The WSGI application: `gunicorn backfill_portal.wsgi:application`.

A bad setting stops the server at start with one line naming it (core/startup.py), as
manage.py says it: under gunicorn as its "App failed to load" (AppImportError: the
message alone, and the server halts instead of booting workers over and over); under
another server as ImproperlyConfigured."""
import os
import sys

from django.core.exceptions import ImproperlyConfigured
from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "backfill_portal.settings")


def _refuse(problem: str):
    message = f"configuration error: {problem}"
    if "gunicorn" in sys.modules:
        from gunicorn.errors import AppImportError

        raise AppImportError(message)
    raise ImproperlyConfigured(message)


try:
    from backfill_portal.core.startup import configuration_problem

    _problem = configuration_problem(process="web")
except ImproperlyConfigured as exc:
    _problem = str(exc)
if _problem:
    _refuse(_problem)
application = get_wsgi_application()
