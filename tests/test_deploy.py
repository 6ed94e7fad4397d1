"""Production settings: `manage.py check --deploy` reports nothing, and bad
environment values fail loudly at start-up."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def manage(*args, **env):
    # Only what a deployment would set: nothing a test run itself put in the environment.
    dropped = ("DEBUG", "SECRET_KEY", "ALLOWED_HOSTS", "DJANGO_ALLOW_ASYNC_UNSAFE")
    full = {k: v for k, v in os.environ.items() if k not in dropped}
    full.update(env)
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=full, capture_output=True, text=True,
                          timeout=120)


def test_check_deploy_is_clean_with_production_settings():
    result = manage("check", "--deploy", DEBUG="0", SECRET_KEY="k" * 60 + "-production-only-Zq9", ALLOWED_HOSTS="portal.example.com")
    assert result.returncode == 0, result.stderr
    assert "no issues" in result.stdout


def test_bad_environment_values_fail_loudly():
    result = manage("check", DEBUG="maybe")
    assert result.returncode != 0 and "DEBUG='maybe' is not a boolean" in result.stderr
    result = manage("check", DEBUG="0")
    assert result.returncode != 0 and "SECRET_KEY must be set" in result.stderr
