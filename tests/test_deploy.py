"""Production settings: `manage.py check --deploy` reports nothing, and bad
environment values fail loudly at start-up."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def manage(*args, **env):
    # Only what a deployment would set: nothing a test run itself put in the environment.
    dropped = ("DEBUG", "SECRET_KEY", "ALLOWED_HOSTS", "DJANGO_ALLOW_ASYNC_UNSAFE", "AUDIT_KEY", "AUDIT_OLD_KEYS")
    full = {k: v for k, v in os.environ.items() if k not in dropped}
    full.update(env)
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=full, capture_output=True, text=True,
                          timeout=120)


PRODUCTION = {"DEBUG": "0", "SECRET_KEY": "k" * 60 + "-production-only-Zq9", "ALLOWED_HOSTS": "portal.example.com"}
AUDIT_KEY = "prod1:" + "a" * 40 + "-audit-only-Xk2"


def test_check_deploy_is_clean_with_production_settings():
    # AUDIT_KEY is now a production setting too (the audit chain's HMAC key).
    result = manage("check", "--deploy", **PRODUCTION, AUDIT_KEY=AUDIT_KEY)
    assert result.returncode == 0, result.stderr
    assert "no issues" in result.stdout


def test_bad_environment_values_fail_loudly():
    result = manage("check", DEBUG="maybe")
    assert result.returncode != 0 and "DEBUG='maybe' is not a boolean" in result.stderr
    result = manage("check", DEBUG="0")
    assert result.returncode != 0 and "SECRET_KEY must be set" in result.stderr


def test_production_refuses_to_start_without_an_audit_key():
    result = manage("check", **PRODUCTION)
    assert result.returncode != 0
    assert result.stderr.startswith("configuration error: AUDIT_KEY must be set when DEBUG is off")
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def test_bad_audit_keys_fail_loudly():
    result = manage("check", **PRODUCTION, AUDIT_KEY="just-a-secret-without-an-id-but-long-enough")
    assert result.returncode != 0 and "AUDIT_KEY must be 'id:secret'" in result.stderr
    result = manage("check", **PRODUCTION, AUDIT_KEY="k1:short")
    assert result.returncode != 0 and "the secret of key 'k1' must be at least 32 characters" in result.stderr
    result = manage("check", **PRODUCTION, AUDIT_KEY=AUDIT_KEY, AUDIT_OLD_KEYS=AUDIT_KEY)
    assert result.returncode != 0 and "key id 'prod1' is given twice" in result.stderr


def test_debug_without_an_audit_key_makes_one_dev_key_in_var(tmp_path):
    """`make run` and the tests need no set-up: DEBUG generates a key under var/ once,
    readable by its owner only, and every later process uses the same one."""
    env = {"DEBUG": "1", "BACKFILL_VAR_DIR": str(tmp_path), "DATABASE_URL": f"sqlite:///{tmp_path / 'p.sqlite3'}"}
    assert manage("check", **env).returncode == 0
    key_file = tmp_path / "audit-dev.key"
    key = key_file.read_text()
    assert key_file.stat().st_mode & 0o777 == 0o600
    key_id, secret = key.strip().split(":")
    assert key_id.startswith("dev-") and len(secret) == 64
    assert manage("check", **env).returncode == 0
    assert key_file.read_text() == key
