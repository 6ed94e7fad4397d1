"""Metadata connections held under concurrent API clients, with and without the pool.

For each server (runserver, as `make run` starts it; gunicorn with threaded workers, as
docs/deploy.md can run it) and each mode (the pool: DATABASE_POOL_MAX_SIZE, the
default; none: DATABASE_POOL_MAX_SIZE=0, a connection per thread kept for
DATABASE_CONN_MAX_AGE), CLIENTS threads make CALLS token-authenticated GETs each over
five list endpoints; pg_stat_activity is sampled every 20 ms for the connections
carrying the server's application_name. Prints clients x calls, the most connections
held, and the answers that were not 200 (by status; refused or reset connections as 0).

PostgreSQL only (DATABASE_URL=postgres://...): a scratch database of its own.
The server's max_connections is shared: the unbounded mode here can reach it.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/x CLIENTS=24 CALLS=12 .venv/bin/python benchmarks/connections.py
"""
from __future__ import annotations

import collections
import http.client
import os
import socket
import subprocess
import sys
import threading
import time
import uuid

from _setup import ROOT, scratch_django

CLIENTS = int(os.environ.get("CLIENTS", "24"))
CALLS = int(os.environ.get("CALLS", "12"))
POOL = int(os.environ.get("POOL", "4"))
PATHS = ["/api/requests/", "/api/datasets/", "/api/jobs/", "/api/runs/", "/api/audit/"]
SERVERS = {
    "runserver": ["manage.py", "runserver", "--noreload", "--skip-checks"],
    "gunicorn 2x8": ["-m", "gunicorn", "backfill_portal.wsgi:application", "--workers", "2",
                     "--worker-class", "gthread", "--threads", "8"],
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def get(port: int, path: str, token: str) -> int:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        conn.request("GET", path, headers={"Host": "127.0.0.1", "Authorization": f"Token {token}"})
        response = conn.getresponse()
        response.read()
        conn.close()
        return response.status
    except OSError:
        return 0


def measure(server: str, pool: int, url: str, tokens: list[str], admin) -> tuple[int, collections.Counter]:
    app_name = f"bf_bench_{uuid.uuid4().hex[:8]}"
    port = free_port()
    args = SERVERS[server] + ([f"127.0.0.1:{port}"] if server == "runserver" else ["--bind", f"127.0.0.1:{port}"])
    env = {**os.environ, "DATABASE_URL": f"{url}?application_name={app_name}", "DATABASE_POOL_MAX_SIZE": str(pool),
           "LOG_LEVEL": "ERROR"}
    proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        while get(port, "/healthz", "") != 200:
            if proc.poll() is not None:
                raise SystemExit(f"{server} exited with {proc.returncode}")
            time.sleep(0.2)
        answers: collections.Counter = collections.Counter()
        lock = threading.Lock()
        done = threading.Event()
        peak = 0

        def client(i: int) -> None:
            for j in range(CALLS):
                status = get(port, PATHS[(i + j) % len(PATHS)], tokens[i % len(tokens)])
                with lock:
                    answers[status] += 1

        def sample() -> None:
            nonlocal peak
            while not done.is_set():
                n = admin.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                                  [app_name]).fetchone()[0]
                peak = max(peak, n)
                time.sleep(0.02)

        sampler = threading.Thread(target=sample)
        sampler.start()
        threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        done.set()
        sampler.join()
        return peak, answers
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main() -> None:
    if not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        raise SystemExit("PostgreSQL only: set DATABASE_URL=postgres://...")
    scratch_django("connections")
    import psycopg
    from django.contrib.auth.models import User

    from backfill_portal.core.services.tokens import api_token_issue

    url = os.environ["DATABASE_URL"]
    tokens = [api_token_issue(actor=u, user=u, via="benchmark")[1] for u in User.objects.filter(is_active=True)[:5]]
    print(f"{CLIENTS} clients x {CALLS} calls, {len(PATHS)} API list endpoints; pool: DATABASE_POOL_MAX_SIZE={POOL}")
    print(f"{'server':<14} {'mode':<8} {'connections':>11} {'not 200':>8}  answers")
    with psycopg.connect(url, autocommit=True) as admin:
        for server in SERVERS:
            for mode, pool in (("none", 0), ("pool", POOL)):
                peak, answers = measure(server, pool, url, tokens, admin)
                bad = sum(n for status, n in answers.items() if status != 200)
                print(f"{server:<14} {mode:<8} {peak:>11} {bad:>8}  {dict(sorted(answers.items()))}", flush=True)


if __name__ == "__main__":
    main()
