"""The Celery app: `celery -A backfill_portal worker`."""
import logging
import os
import sys
from pathlib import Path

from celery import Celery
from celery.signals import beat_init, celeryd_init, setup_logging, task_postrun, task_prerun

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "backfill_portal.settings")


def started_by_celery(argv: list[str]) -> bool:
    """Whether this process is the `celery` command (`celery ...`, `python -m celery ...`)."""
    program = Path(argv[0]) if argv and argv[0] else None
    return program is not None and (program.name == "celery" or program.parent.name == "celery")


if started_by_celery(sys.argv):
    # Celery reads its configuration (Django's settings) while it parses the command
    # line, before any signal: a bad environment value is one line here, as manage.py
    # says it, not a traceback through click.
    from django.conf import settings as _settings
    from django.core.exceptions import ImproperlyConfigured

    try:
        _settings.INSTALLED_APPS  # noqa: B018 (loads the settings)
    except ImproperlyConfigured as exc:
        sys.exit(f"configuration error: {exc}")

app = Celery("backfill_portal")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


def refuse_to_start_if_misconfigured(process: str) -> None:
    """A worker or scheduler with a setting that would fail every task (a WAREHOUSE_URL
    no backend serves, a metadata database that does not answer) stops at start with
    one line (core/startup.py) instead of taking work."""
    from backfill_portal.core.startup import configuration_problem

    problem = configuration_problem(process=process)
    if problem:
        # To the real stderr: by now Celery may have redirected sys.stderr to its logger.
        print(f"configuration error: {problem}", file=sys.__stderr__, flush=True)
        raise SystemExit(1)


@celeryd_init.connect
def configure_logging_early(**kwargs) -> None:
    """The worker warns about running as root before it sets logging up: configure it
    first, so that warning is a JSON line too. Then the worker's start-up checks."""
    configure_logging(redirect=False)
    refuse_to_start_if_misconfigured("worker")


@beat_init.connect
def check_the_scheduler(**kwargs) -> None:
    refuse_to_start_if_misconfigured("beat")


def loglevel_given(argv: list[str]) -> bool:
    """Whether `--loglevel`/`-l` was on the command line. Celery passes its default,
    WARNING, when it was not, which hid every INFO line (a run's log included) of a
    worker started as docs/deploy.md says: then LOG_LEVEL (settings.LOGGING) decides."""
    return any(a in ("-l", "--loglevel") or a.startswith(("--loglevel=", "-l")) for a in argv[1:])


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
    if loglevel and loglevel_given(sys.argv):
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
