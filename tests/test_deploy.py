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


def test_a_database_the_portal_does_not_support_is_named_at_start():
    result = manage("check", DATABASE_URL="mysql://root@127.0.0.1/portal")
    assert result.returncode != 0
    assert result.stderr.strip() == ("configuration error: DATABASE_URL: mysql:// is not supported; use "
                                     "postgres://... (or sqlite:///... to try it out)")


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


# -- the long-running processes refuse a bad setting at start, with one line ----------------

def start(*command, **env):
    """Run a server process as deployed (celery, gunicorn) with `env` on top; it must stop
    by itself: a process that refuses to start exits within seconds."""
    dropped = ("DEBUG", "SECRET_KEY", "ALLOWED_HOSTS", "DJANGO_ALLOW_ASYNC_UNSAFE", "AUDIT_KEY", "AUDIT_OLD_KEYS",
               "DATABASE_URL", "CELERY_BROKER_URL")
    full = {k: v for k, v in os.environ.items() if k not in dropped}
    full.update(env)
    bin_dir = Path(sys.executable).parent
    return subprocess.run([str(bin_dir / command[0]), *command[1:]], cwd=ROOT, env=full, capture_output=True,
                          text=True, timeout=60)


def last_line(result) -> str:
    return (result.stderr.strip().splitlines() or [""])[-1]


def test_a_worker_with_a_warehouse_url_no_backend_serves_stops_at_start_with_one_line(tmp_path):
    """The exploratory deploy test: such a worker started, took tasks and failed each,
    leaving attempts running until the sweeper found them."""
    result = start("celery", "-A", "backfill_portal", "worker", "--pool", "solo",
                   BACKFILL_VAR_DIR=str(tmp_path), WAREHOUSE_URL="mysql://x@127.0.0.1/wh")
    assert result.returncode == 1, result.stderr[-2000:]
    assert last_line(result).startswith("configuration error: WAREHOUSE_URL: unsupported warehouse URL scheme "
                                        "'mysql'")
    assert "Traceback" not in result.stderr and "ready." not in result.stderr


def test_a_worker_whose_metadata_database_does_not_answer_stops_at_start_naming_the_reason(tmp_path):
    result = start("celery", "-A", "backfill_portal", "worker", "--pool", "solo",
                   BACKFILL_VAR_DIR=str(tmp_path), DATABASE_URL="postgres://postgres@127.0.0.1:1/nowhere")
    assert result.returncode == 1, result.stderr[-2000:]
    line = last_line(result)
    assert line.startswith("configuration error: the metadata database (DATABASE_URL) does not answer: ")
    assert "Connection refused" in line and "Traceback" not in result.stderr


def test_a_bad_environment_value_stops_the_worker_and_the_scheduler_with_one_line(tmp_path):
    for command in (("celery", "-A", "backfill_portal", "worker", "--pool", "solo"),
                    ("celery", "-A", "backfill_portal", "beat", "-s", str(tmp_path / "schedule"))):
        result = start(*command, BACKFILL_VAR_DIR=str(tmp_path), SWEEP_SECONDS="abc")
        assert result.returncode != 0
        assert result.stderr.strip() == "configuration error: SWEEP_SECONDS='abc' is not an integer", command
        result = start(*command, BACKFILL_VAR_DIR=str(tmp_path), DEBUG="0")
        assert result.stderr.strip() == "configuration error: SECRET_KEY must be set when DEBUG is off", command
    # The scheduler checks what the worker does, but the database (it uses none).
    result = start("celery", "-A", "backfill_portal", "beat", "-s", str(tmp_path / "schedule"),
                   BACKFILL_VAR_DIR=str(tmp_path), WAREHOUSE_URL="mysql://x@127.0.0.1/wh")
    assert result.returncode == 1
    assert last_line(result).startswith("configuration error: WAREHOUSE_URL: unsupported warehouse URL scheme")


def test_gunicorn_refuses_a_bad_setting_with_one_line_and_stops(tmp_path):
    """Not a traceback and 'Worker failed to boot', nor workers booted over and over: the
    message and gunicorn's 'App failed to load', then it halts."""
    for env, message in (({"WAREHOUSE_URL": "mysql://x@127.0.0.1/wh"}, "configuration error: WAREHOUSE_URL: "
                                                                         "unsupported warehouse URL scheme 'mysql'"),
                         ({"DEBUG": "0"}, "configuration error: SECRET_KEY must be set when DEBUG is off")):
        result = start("gunicorn", "backfill_portal.wsgi:application", "--bind", "127.0.0.1:0", "--workers", "1",
                       BACKFILL_VAR_DIR=str(tmp_path), **env)
        assert result.returncode != 0
        lines = result.stderr.splitlines()
        assert any(line.startswith(message) for line in lines), result.stderr[-2000:]
        assert "App failed to load" in result.stderr and "Traceback" not in result.stderr


def test_the_worker_logs_at_log_level_unless_its_command_line_says_otherwise(monkeypatch):
    """Celery hands its default WARNING to the logging set-up when no --loglevel is
    given, which hid every INFO line (run logs included) of a worker started as
    docs/deploy.md says."""
    import logging

    from backfill_portal.celery import configure_logging, loglevel_given

    assert not loglevel_given(["celery", "-A", "backfill_portal", "worker", "-Q", "backfill"])
    assert loglevel_given(["celery", "worker", "--loglevel", "DEBUG"]) and loglevel_given(["celery", "worker", "-l",
                                                                                            "info"])
    assert loglevel_given(["celery", "worker", "--loglevel=ERROR"])
    root = logging.getLogger()
    before, handlers = root.level, root.handlers[:]
    try:
        monkeypatch.setattr(sys, "argv", ["celery", "-A", "backfill_portal", "worker"])
        configure_logging(loglevel=logging.WARNING, redirect=False)
        assert root.level == logging.INFO  # settings.LOG_LEVEL
        monkeypatch.setattr(sys, "argv", ["celery", "-A", "backfill_portal", "worker", "--loglevel", "ERROR"])
        configure_logging(loglevel=logging.ERROR, redirect=False)
        assert root.level == logging.ERROR
    finally:
        root.setLevel(before)
        root.handlers[:] = handlers
