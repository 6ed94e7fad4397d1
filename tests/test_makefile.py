"""`make run` says what it is doing before each long step (pip, migrations, the demo load)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_each_long_step_of_make_run_is_announced_before_it_starts():
    # --always-make: as on a fresh checkout; --dry-run: print the recipe, run nothing.
    done = subprocess.run(["make", "--always-make", "--dry-run", "run"], cwd=ROOT, capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()

    def first(text: str) -> int:
        return next(i for i, line in enumerate(lines) if text in line)

    assert first("installing the Python dependencies") < first("pip install")
    assert first("migrating the metadata database") < first("manage.py migrate")
    assert first("loading the demo") < first("manage.py load_demo") < first("manage.py run_portal")
