"""The filesystem broker (the default of `make run`) keeps every folder under var/."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# What a worker does at start for its remote-control mailbox: bind a queue to a fanout exchange.
BIND_FANOUT = (
    "import django; django.setup();"
    "from kombu import Exchange, Queue;"
    "from backfill_portal.celery import app;"
    "conn = app.connection_for_write();"
    "Queue('probe', Exchange('probe.pidbox', type='fanout'))(conn.default_channel).declare();"
    "conn.release()"
)


def test_a_fanout_binding_writes_under_var_not_into_the_working_directory(tmp_path):
    var = tmp_path / "var"
    env = {**os.environ, "BACKFILL_VAR_DIR": str(var), "CELERY_BROKER_URL": "filesystem://",
           "DJANGO_SETTINGS_MODULE": "backfill_portal.settings", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", BIND_FANOUT], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "control").exists()
    assert any((var / "broker" / "control").iterdir())
