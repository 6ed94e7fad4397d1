"""Real Celery worker processes for the worker tests (`-m worker`): one way to start them
on this test's PostgreSQL metadata, its warehouse and the broker, and to stop them.
tests/conftest.py loads this module as a plugin, so the `start_worker` fixture is there
for tests/execution and tests/ops alike."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

ROOT = Path(__file__).resolve().parents[1]
BROKER = os.environ.get("CELERY_BROKER_URL", "")
QUEUES = "production,backfill"


def worker_env(warehouse_url: str, **extra) -> dict:
    """The environment of a worker process: this test's metadata database, `warehouse_url`
    and the broker; `extra` adds settings (SWEEP_SECONDS=1, ...), stringified."""
    db = settings.DATABASES["default"]
    return {
        **os.environ,
        "DATABASE_URL": f"postgres://{db['USER'] or 'postgres'}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}",
        "WAREHOUSE_URL": warehouse_url,
        "CELERY_BROKER_URL": BROKER,
        "LOG_LEVEL": "INFO",
        **{key: str(value) for key, value in extra.items()},
    }


def purge(env: dict) -> None:
    """Drop what an earlier test left in the broker's queues, from this process (what
    `celery purge -f -Q ...` does, without starting a Celery process: ~5 s on the
    loaded CI machine, for each worker a test starts)."""
    from kombu import Connection

    with Connection(env["CELERY_BROKER_URL"], connect_timeout=10) as conn:
        channel = conn.default_channel
        for queue in QUEUES.split(","):
            channel.queue_purge(queue)


def wait_until_ready(proc: subprocess.Popen, node: str, broker_url: str, *, timeout: float) -> None:
    """Until the worker `node` answers a ping through its broker (it consumes from its
    queues then), at most `timeout` seconds; fail with its log if it ended instead."""
    from kombu import Connection

    from backfill_portal.celery import app

    deadline = time.time() + timeout
    with Connection(broker_url, connect_timeout=10) as conn:
        while time.time() < deadline:
            if proc.poll() is not None:
                raise AssertionError(f"worker {node} exited with {proc.returncode}: "
                                     f"{Path(proc.log_path).read_text()[-3000:]}")
            if app.control.ping(destination=[node], timeout=0.5, connection=conn):
                return
    raise AssertionError(f"worker {node} did not answer a ping within {timeout}s: "
                         f"{Path(proc.log_path).read_text()[-3000:]}")


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the process group (the pool's children too), SIGKILL after 20 s; then
    close its log. Safe to call twice."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=20)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=20)
    log = getattr(proc, "log", None)
    if log is not None and not log.closed:
        log.close()


@pytest.fixture
def start_worker(warehouse_url, catalog, tmp_path):
    """start_worker(name=..., ...) -> a real `celery -A backfill_portal worker` process
    (two pool processes, prefetch 1, no mingle or gossip), started after the broker's
    queues are purged; every process started is stopped at teardown.

    - `warehouse_url`: the warehouse it writes (default: this test's);
    - `queues`: its -Q, or None to start it the plain way, without -Q;
    - `beat`: None, "embedded" (-B) or "separate" (a `celery beat` process beside it);
      either way the periodic scheduler sends the sweeper through the broker;
    - `quiet`: Celery's -q (no banner); `args`: more worker arguments;
    - `log`: the file its output goes to (default var/<name>-<pid>.log), as `proc.log_path`;
    - `settle`: how long to wait, at most, for it to answer a ping (ready to take tasks)
      before returning it (the tests that time nothing but their own polling pass 0:
      no wait);
    - any other keyword is a setting in its environment (SWEEP_SECONDS=1, ...)."""
    if connection.vendor != "postgresql":
        pytest.skip("a worker process needs a database it can share: PostgreSQL (DATABASE_URL)")
    started: list[subprocess.Popen] = []
    default_url = warehouse_url

    def start(*, name: str, warehouse_url: str = default_url, queues: str | None = QUEUES, beat: str | None = None,
              quiet: bool = False, args: tuple[str, ...] = (), log: Path | None = None, settle: float = 60.0,
              **env_extra) -> subprocess.Popen:
        env = worker_env(warehouse_url, **env_extra)
        purge(env)
        if beat == "separate":
            beat_log = open(Path(settings.VAR_DIR) / f"test-beat-{os.getpid()}.log", "w")
            beat_proc = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "backfill_portal", "beat",
                 "--schedule", str(tmp_path / "celerybeat-schedule")],
                cwd=ROOT, env=env, stdout=beat_log, stderr=subprocess.STDOUT, start_new_session=True)
            beat_proc.log = beat_log
            started.append(beat_proc)
        command = [sys.executable, "-m", "celery", "-A", "backfill_portal", *(["-q"] if quiet else []), "worker"]
        if beat == "embedded":
            command += ["-B", "-s", str(tmp_path / "celerybeat-schedule")]
        if queues:
            command += ["-Q", queues]
        node = f"{name}{os.getpid()}@{socket.gethostname()}"
        command += ["--concurrency", "2", "--prefetch-multiplier", "1", "--without-mingle", "--without-gossip",
                    "-n", node, *args]
        log_path = log or Path(settings.VAR_DIR) / f"{name}-{os.getpid()}.log"
        log_file = open(log_path, "w")
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log_file, stderr=subprocess.STDOUT,
                                start_new_session=True)
        proc.log, proc.log_path = log_file, log_path
        started.append(proc)
        if settle:
            wait_until_ready(proc, node, env["CELERY_BROKER_URL"], timeout=settle)
        return proc

    yield start
    for proc in reversed(started):
        stop(proc)
