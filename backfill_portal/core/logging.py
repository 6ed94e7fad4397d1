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
import os
import re
from datetime import datetime, timezone

from django.conf import settings

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


@contextlib.contextmanager
def run_log_context(**fields):
    """`log_context` for one run's part of a task that works on several runs in turn (a
    bundle): inside, lines name that run (and what log_contexts inside it add, to the
    task's scope too); after it, the task's scope is as it was, so the task's later
    lines do not name a run they are not about."""
    scope = _task_scope.get()
    saved = dict(scope) if scope is not None else None
    try:
        with log_context(**fields):
            yield
    finally:
        if scope is not None:
            scope.clear()
            scope.update(saved)


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


# The shape of a run_id (execution.models.new_run_id); anything else never names a file.
RUN_ID_SHAPE = re.compile(r"run_[0-9a-f]{16}")
RUN_LOG_MAX_LINES = 500


class RunLogHandler(logging.Handler):
    """Keeps each run's own lines: a record that belongs to a run (a run_id in its
    context) is appended, formatted as above, to `<directory>/<run_id>.jsonl`, which the
    run page reads (`run_log_lines`). One short append per line (O_APPEND: the lines of
    two processes do not interleave within a line); an unwritable directory loses the
    copy, never the record, which the console handler still prints. Workers on other
    machines need the directory shared (RUN_LOG_DIR, docs/deploy.md)."""

    def __init__(self, directory: str | None = None):
        super().__init__()
        self.directory = directory  # None: settings.RUN_LOG_DIR, read at each line (tests change it)
        self.setFormatter(StructuredFormatter())
        self._made: set[str] = set()

    def emit(self, record: logging.LogRecord) -> None:
        run_id = getattr(record, "run_id", None) or current_log_context().get("run_id")
        if not run_id or not RUN_ID_SHAPE.fullmatch(str(run_id)):
            return
        directory = self.directory
        if directory is None:
            directory = getattr(settings, "RUN_LOG_DIR", "") if settings.configured else ""
        if not directory:
            return
        try:
            if directory not in self._made:
                os.makedirs(directory, exist_ok=True)
                self._made.add(directory)
            line = self.format(record) + "\n"
            with open(os.path.join(directory, f"{run_id}.jsonl"), "a", encoding="utf-8") as out:
                out.write(line)
        except Exception:  # noqa: BLE001 - logging must never break the work it records
            self.handleError(record)


def run_log_lines(directory: str, run_id: str, *, limit: int = RUN_LOG_MAX_LINES) -> tuple[list[dict], int]:
    """The last `limit` lines a run logged (parsed) and how many it logged in all;
    ([], 0) when it logged none here or the directory is not kept."""
    if not directory or not RUN_ID_SHAPE.fullmatch(run_id or ""):
        return [], 0
    try:
        with open(os.path.join(directory, f"{run_id}.jsonl"), encoding="utf-8") as src:
            raw = src.read().splitlines()
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return [], 0
    lines = []
    for text in raw[-limit:]:
        try:
            lines.append(json.loads(text))
        except ValueError:  # a line cut by a full disk: shown as it is
            lines.append({"msg": text})
    return lines, len(raw)
