"""Structured logging: one JSON object per line, with run_id, attempt_no and
request_id taken from a context variable that execution sets around each attempt."""
from __future__ import annotations

import contextlib
import contextvars
import json
import logging
from datetime import datetime, timezone

_log_context: contextvars.ContextVar[dict] = contextvars.ContextVar("log_context", default={})


@contextlib.contextmanager
def log_context(**fields):
    token = _log_context.set({**_log_context.get(), **{k: v for k, v in fields.items() if v is not None}})
    try:
        yield
    finally:
        _log_context.reset(token)


def current_log_context() -> dict:
    return dict(_log_context.get())


class StructuredFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        payload = {
            "ts": datetime.fromtimestamp(record.created, tz=timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
            **_log_context.get(),
        }
        for key in ("run_id", "attempt_no", "request_id"):
            if hasattr(record, key):
                payload[key] = getattr(record, key)
        if record.exc_info:
            payload["exc"] = self.formatException(record.exc_info)
        return json.dumps(payload, default=str)
