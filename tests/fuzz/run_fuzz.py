"""Schemathesis against a live server: every operation of /api/schema/, all phases,
bounded examples, once per role (a token each), and fails on any 5xx or any answer the
schema does not describe (status, content type, body, headers).

    .venv/bin/python tests/fuzz/run_fuzz.py            # SQLite in a temporary folder
    DATABASE_URL=postgres://... WAREHOUSE_URL=postgresql://... tests/fuzz/run_fuzz.py

On PostgreSQL the two databases named by the URLs are DROPPED and created anew: give it
databases of its own. The server is `manage.py runserver --noreload` with DEBUG off on a
free loopback port; it is stopped at the end whatever happens. FUZZ_MAX_EXAMPLES (default
10) bounds the examples per operation and phase; FUZZ_SEED makes a run repeatable;
FUZZ_ROLES (e.g. "requester,anonymous") fuzzes only those roles.
"""
from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

import requests

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
SCHEMATHESIS = str(Path(PYTHON).with_name("schemathesis"))
# One persona per role (the demo users); "anonymous" sends no credentials at all.
ROLES = {"requester": "alice", "owner": "olivia", "oncall": "oscar", "auditor": "audrey", "anonymous": None}
CHECKS = ",".join([
    "not_a_server_error", "status_code_conformance", "content_type_conformance", "response_headers_conformance",
    "response_schema_conformance", "unsupported_method", "missing_required_header",
])
PHASES = "examples,coverage,fuzzing,stateful"


def fuzz_roles() -> dict:
    """FUZZ_ROLES (comma-separated role names, default all) picks whose calls are fuzzed:
    each role's run takes about two minutes, so CI splits the roles between its passes."""
    asked = [name.strip() for name in os.environ.get("FUZZ_ROLES", "").split(",") if name.strip()]
    unknown = [name for name in asked if name not in ROLES]
    if unknown:
        raise SystemExit(f"fuzz: unknown role in FUZZ_ROLES: {', '.join(unknown)} (known: {', '.join(ROLES)})")
    return {name: ROLES[name] for name in asked} if asked else dict(ROLES)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def recreate_postgres_database(url: str) -> None:
    import psycopg

    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    if not re.fullmatch(r"[A-Za-z0-9_]+", name):
        sys.exit(f"fuzz: refusing to recreate database {name!r} (letters, digits and _ only)")
    admin = parts._replace(path="/postgres", scheme="postgresql").geturl()
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def manage(env: dict, *args: str) -> str:
    done = subprocess.run([PYTHON, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"fuzz: manage.py {' '.join(args)} failed:\n{done.stdout}{done.stderr}")
    return done.stdout


def seed(base: str, tokens: dict[str, str]) -> None:
    """A few objects so that detail routes have something to find: a draft request and a
    submitted one (with its approval steps)."""
    alice = {"Authorization": f"Token {tokens['requester']}"}
    body = {"job": "dwd_order_items", "start": "2022-10-01", "end": "2022-10-03", "reason": "fuzz seed"}
    for reason in ("fuzz seed draft", "fuzz seed submitted"):
        created = requests.post(f"{base}/api/requests/", json={**body, "reason": reason}, headers=alice, timeout=30)
        created.raise_for_status()
        if "submitted" in reason:
            requests.post(f"{base}/api/requests/{created.json()['id']}/submit/", json={}, headers=alice,
                          timeout=30).raise_for_status()


def main() -> int:
    workdir = Path(tempfile.mkdtemp(prefix="bf-fuzz-"))
    env = {**os.environ, "BACKFILL_VAR_DIR": str(workdir), "DEBUG": "0", "SECRET_KEY": "fuzz-" + "k" * 50,
           "SECURE_SSL_REDIRECT": "0", "SESSION_COOKIE_SECURE": "0", "CSRF_COOKIE_SECURE": "0",
           "ALLOWED_HOSTS": "127.0.0.1,localhost", "PYTHONUNBUFFERED": "1",
           # DEBUG off needs a key for the audit chain; a throwaway one for a throwaway database.
           "AUDIT_KEY": f"fuzz:{secrets.token_hex(32)}"}
    for key in ("DATABASE_URL", "WAREHOUSE_URL"):
        if env.get(key, "").startswith("postgres"):
            recreate_postgres_database(env[key])
    roles = fuzz_roles()
    backend = "PostgreSQL" if env.get("DATABASE_URL", "").startswith("postgres") else "SQLite"
    manage(env, "migrate", "--noinput")
    manage(env, "load_demo", "--first", "2022-09-25", "--last", "2022-10-10")
    tokens = {}
    for role, user in ROLES.items():
        if user:
            tokens[role] = manage(env, "issue_token", user, "--label", "fuzz").strip()

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = open(workdir / "server.log", "w")
    server = subprocess.Popen([PYTHON, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"], cwd=ROOT,
                              env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    failed: list[str] = []
    try:
        for _ in range(120):
            try:
                if requests.get(f"{base}/api/schema/?format=json", timeout=5).status_code in (200, 401, 403):
                    break
            except requests.ConnectionError:
                pass
            if server.poll() is not None:
                sys.exit(f"fuzz: the server exited with {server.returncode}; see {workdir / 'server.log'}")
            time.sleep(0.5)
        schema = workdir / "schema.json"
        answer = requests.get(f"{base}/api/schema/?format=json", headers={"Authorization": f"Token {tokens['auditor']}"},
                              timeout=30)
        answer.raise_for_status()
        schema.write_bytes(answer.content)
        seed(base, tokens)
        max_examples = os.environ.get("FUZZ_MAX_EXAMPLES", "10")
        for role, user in roles.items():
            print(f"== fuzz ({backend}): {role}" + (f" ({user})" if user else ""), flush=True)
            cmd = [SCHEMATHESIS, "run", str(schema), "--url", f"{base}", "--phases", PHASES, "--checks", CHECKS,
                   "--max-examples", max_examples, "--workers", "1", "--request-timeout", "30",
                   "--suppress-health-check", "all", "--no-shrink", "--warnings", "off"]
            if os.environ.get("FUZZ_SEED"):
                cmd += ["--seed", os.environ["FUZZ_SEED"]]
            if user:
                # Revoking the token the run is made with would leave the rest of it 401s.
                cmd += ["--header", f"Authorization: Token {tokens[role]}", "--exclude-path", "/api/auth/token/revoke/"]
            if subprocess.run(cmd, cwd=workdir, env=env).returncode != 0:
                failed.append(role)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
        log.close()
    errors = [line for line in (workdir / "server.log").read_text().splitlines() if '" 5' in line[-30:]
              or "Traceback" in line]
    if errors:
        print(f"fuzz: the server logged {len(errors)} error lines, e.g.:\n" + "\n".join(errors[:10]))
        failed.append("server log")
    passed = [role for role in roles if role not in failed]
    if failed:
        print(f"fuzz ({backend}): FAILED for {', '.join(failed)}; the server log is {workdir / 'server.log'}")
    else:
        print(f"fuzz ({backend}): 0 server errors, 0 schema violations for {', '.join(roles)}")
        shutil.rmtree(workdir, ignore_errors=True)
    # The plain closing line CI reads: one "test" per role (and one for the server log).
    print(f"fuzz: {len(passed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
