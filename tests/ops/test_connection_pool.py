"""Metadata connections stay bounded under many concurrent clients: a real gunicorn
(threaded workers) on the suite's PostgreSQL test database, as a deployment runs it,
takes its connections from a pool of DATABASE_POOL_MAX_SIZE per process; a request
that finds none free within DATABASE_POOL_TIMEOUT is a 503 with Retry-After, never a
500. Connections are counted in pg_stat_activity by the application_name the server
is given, so the suite's own connections and other databases do not count."""
from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest
from django.db import connection

from backfill_portal.core.services.tokens import api_token_issue

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.django_db(transaction=True),  # the server's processes must see the rows
    pytest.mark.skipif(connection.vendor != "postgresql",
                       reason="the pool is PostgreSQL's (DATABASE_URL=postgres://...; CI's second pass)"),
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def database_url_for(application_name: str) -> str:
    """The suite's test database, as a URL another process can use."""
    s = connection.settings_dict
    auth = quote(s["USER"] or "", safe="") + (":" + quote(s["PASSWORD"], safe="") if s["PASSWORD"] else "")
    return (f"postgres://{auth}@{s['HOST'] or 'localhost'}:{s['PORT'] or 5432}/{s['NAME']}"
            f"?application_name={application_name}")


def admin_conninfo() -> str:
    s = connection.settings_dict
    return psycopg.conninfo.make_conninfo(host=s["HOST"] or "localhost", port=s["PORT"] or 5432,
                                          user=s["USER"] or None, password=s["PASSWORD"] or None, dbname=s["NAME"])


class Server:
    """gunicorn with gthread workers on a free port; its connections carry `app_name`."""

    def __init__(self, tmp_path: Path, *, workers: int, threads: int, pool_max: int, pool_timeout: float,
                 database_url: str | None = None):
        self.app_name = f"bf_pool_test_{uuid.uuid4().hex[:8]}"
        self.port = free_port()
        env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_ALLOW_ASYNC_UNSAFE", "DJANGO_SETTINGS_MODULE")}
        env.update(DATABASE_URL=database_url or database_url_for(self.app_name), DATABASE_POOL_MAX_SIZE=str(pool_max),
                   DATABASE_POOL_TIMEOUT=str(pool_timeout), LOG_LEVEL="WARNING")
        self.log_path = tmp_path / "gunicorn.log"
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "backfill_portal.wsgi:application", "--bind", f"127.0.0.1:{self.port}",
             "--workers", str(workers), "--worker-class", "gthread", "--threads", str(threads), "--timeout", "120"],
            cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT)

    def wait_ready(self) -> None:
        for _ in range(600):
            if self.proc.poll() is not None:
                pytest.fail(f"gunicorn exited with {self.proc.returncode}:\n{self.log_path.read_text()[-3000:]}")
            try:
                status, _, _ = self.get("/healthz")
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        pytest.fail(f"gunicorn did not answer /healthz:\n{self.log_path.read_text()[-3000:]}")

    def get(self, path: str, headers: dict | None = None) -> tuple[int, dict, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        try:
            conn.request("GET", path, headers={"Host": "127.0.0.1", **(headers or {})})
            response = conn.getresponse()
            return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
        finally:
            conn.close()

    def connections(self, admin: psycopg.Connection) -> int:
        return admin.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                             [self.app_name]).fetchone()[0]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@pytest.fixture
def start_server(tmp_path):
    started = []

    def start(**kwargs) -> Server:
        server = Server(tmp_path, **kwargs)
        started.append(server)
        server.wait_ready()
        return server

    yield start
    for server in started:  # before the test database is flushed
        server.stop()


@pytest.fixture
def admin():
    with psycopg.connect(admin_conninfo(), autocommit=True) as conn:
        yield conn


def token_for(user) -> str:
    return api_token_issue(actor=user, user=user, via="test")[1]


def test_many_concurrent_api_clients_get_answers_on_a_bounded_number_of_connections(personas, catalog, start_server,
                                                                                    admin):
    workers, pool_max, clients, calls = 2, 3, 24, 12
    server = start_server(workers=workers, threads=8, pool_max=pool_max, pool_timeout=60)
    tokens = [token_for(personas[name]) for name in ("alice", "olivia", "sam", "oscar", "audrey")]
    paths = ["/api/requests/", "/api/datasets/", "/api/jobs/", "/api/runs/", "/api/audit/"]
    statuses: list[int] = []
    lock = threading.Lock()
    peak = 0
    done = threading.Event()

    def client(i: int) -> None:
        for j in range(calls):
            status, _, _ = server.get(paths[(i + j) % len(paths)],
                                      {"Authorization": f"Token {tokens[i % len(tokens)]}"})
            with lock:
                statuses.append(status)

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, server.connections(admin))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample)
    sampler.start()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    done.set()
    sampler.join()

    assert len(statuses) == clients * calls
    assert [s for s in statuses if s >= 500] == []
    assert set(statuses) == {200}
    assert 1 <= peak <= workers * pool_max, f"{peak} connections held by {workers} processes of pool {pool_max}"
    print(f"\n{clients} clients x {calls} calls: {len(statuses)} answers, 0 errors, "
          f"at most {peak} connections ({workers} processes x pool {pool_max})")


def test_a_request_that_finds_no_free_connection_is_a_503_with_retry_after(personas, start_server, admin):
    """One process with a pool of one: a first request holds the connection (its token
    lookup waits on a lock the test holds); the next, API or page, is a 503 saying why,
    after DATABASE_POOL_TIMEOUT; once the lock goes, both kinds answer again."""
    server = start_server(workers=1, threads=4, pool_max=1, pool_timeout=1)
    token = token_for(personas["alice"])
    auth = {"Authorization": f"Token {token}"}
    held: dict = {}

    with psycopg.connect(admin_conninfo()) as locker:
        locker.execute("LOCK TABLE core_apitoken IN ACCESS EXCLUSIVE MODE")
        first = threading.Thread(target=lambda: held.update(zip(("status", "headers", "body"),
                                                                server.get("/api/requests/", auth))))
        first.start()
        for _ in range(600):  # until the first request waits on the lock, holding the connection
            waiting = admin.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
                                    "AND wait_event_type = 'Lock'", [server.app_name]).fetchone()[0]
            if waiting:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the first request never waited on the lock")

        status, headers, body = server.get("/api/requests/", auth)
        assert status == 503
        assert headers["retry-after"] == "1"
        assert headers["content-type"] == "application/json"
        answer = json.loads(body)
        assert answer["code"] == "database_busy"
        assert "no metadata database connection became free within 1 s" in answer["detail"]

        status, headers, body = server.get("/login/")
        assert status == 503
        assert headers["retry-after"] == "1"
        assert headers["content-type"].startswith("text/html")
        assert b"The portal is busy" in body and b"became free within 1 s" in body

        status, _, _ = server.get("/healthz")  # liveness takes no connection
        assert status == 200
        assert server.connections(admin) == 1
        locker.rollback()

    first.join()
    assert held["status"] == 200, held
    assert server.get("/api/requests/", auth)[0] == 200
    assert server.get("/login/")[0] == 200


def test_a_metadata_database_that_is_down_is_a_503_naming_it_and_readiness_says_so_within_its_timeout(start_server):
    """The exploratory deploy test: with the server down every page waited the pool's
    timeout and then blamed "busy", and /readyz took 10 s whatever HEALTH_CHECK_TIMEOUT
    said. Now the 503 names the database and the driver's reason, and /readyz answers
    within its own timeout."""
    server = start_server(workers=1, threads=2, pool_max=2, pool_timeout=1,
                          database_url="postgres://postgres@127.0.0.1:1/nowhere")
    status, headers, body = server.get("/api/requests/")
    assert status == 503 and headers["retry-after"] == "1"
    answer = json.loads(body)
    assert answer["code"] == "database_busy"
    assert answer["detail"].startswith("the metadata database does not answer (") and "refused" in answer["detail"]
    status, _, body = server.get("/login/")
    assert status == 503 and b"does not answer" in body and b"Traceback" not in body
    started = time.monotonic()
    status, _, body = server.get("/readyz")
    assert status == 503 and time.monotonic() - started < 3  # HEALTH_CHECK_TIMEOUT is 3, the pool's wait never starts
    checks = json.loads(body)["checks"]
    assert checks["database"]["ok"] is False and "refused" in checks["database"]["error"]
