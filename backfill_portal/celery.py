"""The Celery app: `celery -A backfill_portal worker`."""
import os

from celery import Celery
from celery.signals import task_postrun, task_prerun

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "backfill_portal.settings")

app = Celery("backfill_portal")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@task_prerun.connect
@task_postrun.connect
def close_old_connections(sender=None, **kwargs) -> None:
    """Django's connection policy around each task, as around each request: close a
    connection that failed its health check, errored, or is older than CONN_MAX_AGE;
    keep the rest (Celery itself closes them only every CELERY_DB_REUSE_MAX tasks).
    Not for a task run in the caller's process (apply, eager): that is the caller's
    connection, possibly inside its transaction."""
    if getattr(getattr(sender, "request", None), "is_eager", False):
        return
    from django.db import close_old_connections as django_close_old_connections

    django_close_old_connections()
