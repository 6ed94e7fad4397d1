"""Structured logging: one JSON object per line, with run_id, attempt_no and
request_id taken from a context variable that execution sets around each attempt.

Every line carries the three keys (null when the line belongs to no run, attempt or
request), so a reader can filter a worker's output by run without guessing. A Celery
task opens a *task scope* (`task_log_scope`, from the task's headers, in
backfill_portal/celery.py): the fields any `log_context` inside the task sets stay on
the task's later lines too, so Celery's own "Task ... succeeded" line names the
attempt that ran."""
from __future__ import annotations

import contextlib
import contextvars
import json
import logging
from datetime import datetime, timezone

IDENTITY_FIELDS = ("run_id", "attempt_no", "request_id")

_log_context: contextvars.ContextVar[dict] = contextvars.ContextVar("log_context", default={})
_task_scope: contextvars.ContextVar[dict | None] = contextvars.ContextVar("log_task_scope", default=None)


@contextlib.contextmanager
def log_context(**fields):
    fields = {k: v for k, v in fields.items() if v is not None}
    scope = _task_scope.get()
    if scope is not None:
        scope.update(fields)
    token = _log_context.set({**_log_context.get(), **fields})
    try:
        yield
    finally:
        _log_context.reset(token)


def current_log_context() -> dict:
    return {**(_task_scope.get() or {}), **_log_context.get()}


def task_log_scope_open(**fields) -> contextvars.Token:
    """Open a task's scope (see the module docstring); close it with the token."""
    return _task_scope.set({k: v for k, v in fields.items() if v is not None})


def task_log_scope_close(token: contextvars.Token) -> None:
    _task_scope.reset(token)


class StructuredFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        payload = {
            "ts": datetime.fromtimestamp(record.created, tz=timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
            **dict.fromkeys(IDENTITY_FIELDS),
            **current_log_context(),
        }
        for key in IDENTITY_FIELDS:
            if hasattr(record, key):
                payload[key] = getattr(record, key)
        if record.exc_info:
            payload["exc"] = self.formatException(record.exc_info)
        return json.dumps(payload, default=str)
