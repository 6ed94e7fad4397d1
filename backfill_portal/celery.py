"""The Celery app: `celery -A backfill_portal worker`."""
import logging
import os

from celery import Celery
from celery.signals import celeryd_init, setup_logging, task_postrun, task_prerun

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "backfill_portal.settings")

app = Celery("backfill_portal")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@celeryd_init.connect
def configure_logging_early(**kwargs) -> None:
    """The worker warns about running as root before it sets logging up: configure it
    first, so that warning is a JSON line too."""
    configure_logging(redirect=False)


@setup_logging.connect
def configure_logging(loglevel=None, redirect=True, **kwargs) -> None:
    """The project's logging (settings.LOGGING: one JSON line each) in the worker and
    beat too. Without this receiver Celery replaces the root logger's handlers with its
    own `[... INFO/ForkPoolWorker-2] message` format; with it, Celery configures
    nothing, so what it would also do is done here: `--loglevel`, and a task's
    print() going to the log (as a JSON line) instead of raw to stdout."""
    from logging.config import dictConfig

    from django.conf import settings

    dictConfig(settings.LOGGING)
    logging.captureWarnings(True)  # Celery's start-up warnings too
    if loglevel:
        logging.getLogger().setLevel(loglevel)
    if redirect and app.conf.worker_redirect_stdouts:
        app.log.redirect_stdouts(app.conf.worker_redirect_stdouts_level)


_log_scopes: dict = {}


def _header(task, name: str):
    request = task.request
    value = getattr(request, name, None)
    if value is None:
        value = (getattr(request, "headers", None) or {}).get(name)
    return value


@task_prerun.connect
def open_task_log_scope(sender=None, task_id=None, task=None, **kwargs) -> None:
    """Every line the task writes names its run and request (from the headers the
    outbox sent); the attempt joins once the task starts one."""
    from backfill_portal.core.logging import task_log_scope_open

    if task is not None and task_id is not None:
        _log_scopes[task_id] = task_log_scope_open(run_id=_header(task, "run_id"),
                                                   request_id=_header(task, "request_id"))


@task_postrun.connect
def close_task_log_scope(sender=None, task_id=None, **kwargs) -> None:
    from backfill_portal.core.logging import task_log_scope_close

    token = _log_scopes.pop(task_id, None)
    if token is not None:
        task_log_scope_close(token)


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
