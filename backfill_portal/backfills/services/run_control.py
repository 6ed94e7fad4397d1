"""What backfills asks of execution, the layer above it, when it changes a request.

Two of execution's services follow a request's own change in process, not as a task:
once a cancel commits, the request's queued and running runs stop (a task would wait
behind the backfill queue's execute messages, and a verified run of the cancelled
request could publish meanwhile; if the process dies first, the sweeper stops them),
and resuming a failed request retries it, which queues its failed runs again and
answers the caller at once. Runs are execution's, so execution hands these two
services over when Django starts (`ExecutionConfig.ready`); backfills never imports it.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class RunControl:
    # stop_runs(request_id=, actor=, reason=) -> how many it stopped: active runs
    # cancelled, their running attempts failed, open intervals cancelled, each audited
    # as the person's who cancelled (with their reason).
    stop_runs: Callable[..., int]
    # retry_failed(actor=, request_id=) -> the request: failed intervals queued again.
    retry_failed: Callable[..., object]


_control: RunControl | None = None


def run_control_register(control: RunControl) -> None:
    global _control
    _control = control


def run_control() -> RunControl:
    if _control is None:
        raise RuntimeError("no run control registered: the execution app is not installed")
    return _control
