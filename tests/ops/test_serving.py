"""The production start, for real: `collectstatic` into a fresh STATIC_ROOT, then
gunicorn (two worker processes) with DEBUG=0 on a free port, behind what a TLS proxy
would send (X-Forwarded-Proto: https). Signed in, every page answers 200 as HTML, and
every collected static file answers 200 with its content type, gzip when asked;
/healthz, /readyz and /metrics (with its token) answer as documented. On the same
PostgreSQL/Redis as the suite when they are configured, else SQLite files and the
filesystem broker."""
from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import urlencode, urlsplit, urlunsplit

import pytest

ROOT = Path(__file__).resolve().parents[2]
SECRET = "serving-test-" + "k" * 50
METRICS_TOKEN = "serving-test-metrics-token"
# What a browser must be told for the files it would refuse or misread otherwise.
TYPES = {".css": "text/css", ".js": "text/javascript", ".svg": "image/svg+xml", ".png": "image/png",
         ".gif": "image/gif", ".html": "text/html"}

# A request with a run, made through the same services the pages call.
SEED = """
import json
from django.contrib.auth.models import User
from backfill_portal.backfills.services.requests import backfill_request_create, backfill_request_decide, backfill_request_submit
from backfill_portal.execution.models import Run
from backfill_portal.backfills.services.requests import request_start_after_approval
from backfill_portal.execution.services.dispatch import dispatch_request
alice = User.objects.get(username="alice")
req, _ = backfill_request_create(actor=alice, job="dwd_order_items", start="2022-10-01", end="2022-10-03", reason="serving test")
backfill_request_submit(actor=alice, request_id=req.pk, confirm_overlap=True)
for step in req.approval_steps.filter(status="pending").select_related("approver"):
    backfill_request_decide(actor=step.approver or User.objects.get(username="admin"), request_id=req.pk, approve=True)
request_start_after_approval(request_id=req.pk)
dispatch_request(request_id=req.pk)
print("SEED " + json.dumps({"request": req.pk, "run": Run.objects.filter(request=req).first().run_id}))
"""


def with_db(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


@pytest.fixture(scope="module")
def tmp_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("serving")


@pytest.fixture(scope="module")
def databases(tmp_dir):
    """Throwaway metadata and warehouse databases for the server's own processes."""
    made = []
    urls = {}
    for var, default in (("DATABASE_URL", tmp_dir / "portal.sqlite3"), ("WAREHOUSE_URL", tmp_dir / "wh.sqlite3")):
        base = os.environ.get(var, "")
        if base.startswith("postgres"):
            import psycopg

            name = f"bfserve_{uuid.uuid4().hex[:10]}"
            with psycopg.connect(with_db(base, "postgres"), autocommit=True) as conn:
                conn.execute(f'CREATE DATABASE "{name}"')
            made.append((with_db(base, "postgres"), name))
            urls[var] = with_db(base, name)
        else:
            urls[var] = f"sqlite:///{default}"
    yield urls
    import psycopg

    for admin, name in made:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Browser:
    """Plain HTTP with a cookie jar that, like a browser behind TLS, keeps Secure cookies."""

    def __init__(self, port: int):
        self.port = port
        self.cookies: dict[str, str] = {}

    def request(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        sent = {"Host": f"127.0.0.1:{self.port}", "X-Forwarded-Proto": "https", **(headers or {})}
        if self.cookies:
            sent["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        conn.request(method, path, body=body, headers=sent)
        response = conn.getresponse()
        data = response.read()
        for header, value in response.getheaders():
            if header.lower() == "set-cookie":
                name, _, rest = value.partition("=")
                self.cookies[name] = rest.split(";", 1)[0]
        conn.close()
        return response, data

    def get(self, path: str, **headers):
        return self.request("GET", path, headers=headers)


def run_manage(env: dict, *args: str, stdin: str | None = None) -> str:
    result = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, input=stdin,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, (args, result.stdout[-2000:], result.stderr[-3000:])
    return result.stdout


@pytest.fixture(scope="module")
def server(tmp_dir, databases):
    """One server for the module (set-up is most of its cost); the tests only read."""
    tmp_path = tmp_dir
    env = {k: v for k, v in os.environ.items() if k not in ("DEBUG", "SECRET_KEY", "ALLOWED_HOSTS",
                                                             "DJANGO_ALLOW_ASYNC_UNSAFE", "DJANGO_SETTINGS_MODULE")}
    env.update(databases, DEBUG="0", SECRET_KEY=SECRET, ALLOWED_HOSTS="127.0.0.1", METRICS_TOKEN=METRICS_TOKEN,
               AUDIT_KEY="serving:" + "a1" * 20,
               BACKFILL_VAR_DIR=str(tmp_path / "var"), STATIC_ROOT=str(tmp_path / "static"))
    run_manage(env, "migrate", "--noinput")
    run_manage(env, "load_demo", "--demo-passwords", "--first", "2022-09-28", "--last", "2022-10-05",
               "--orders-per-day", "50")
    run_manage(env, "collectstatic", "--noinput")
    seeded = json.loads(run_manage(env, "shell", stdin=SEED).split("SEED ", 1)[1])
    port = free_port()
    log = open(tmp_path / "gunicorn.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "gunicorn", "backfill_portal.wsgi:application",
                             "--bind", f"127.0.0.1:{port}", "--workers", "2", "--timeout", "60"],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    browser = Browser(port)
    deadline = time.time() + 60
    while True:
        try:
            if browser.get("/healthz")[0].status == 200:
                break
        except OSError:
            pass
        assert proc.poll() is None and time.time() < deadline, (tmp_path / "gunicorn.log").read_text()[-3000:]
        time.sleep(0.3)
    yield {"browser": browser, "static_root": tmp_path / "static", "proc": proc, **seeded}
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    log.close()


def sign_in(browser: Browser, username: str, password: str) -> None:
    response, page = browser.get("/login/")
    assert response.status == 200
    token = re.search(rb'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1).decode()
    origin = f"https://127.0.0.1:{browser.port}"
    response, _ = browser.request("POST", "/login/", urlencode(
        {"csrfmiddlewaretoken": token, "username": username, "password": password}).encode(),
        {"Content-Type": "application/x-www-form-urlencoded", "Origin": origin, "Referer": origin + "/login/"})
    assert response.status == 302 and response.getheader("Location") == "/", response.status


def test_gunicorn_with_debug_off_serves_every_page_and_static_file(server):
    browser = server["browser"]
    # Without the proxy's header the server insists on https, as configured for production.
    conn = http.client.HTTPConnection("127.0.0.1", browser.port, timeout=30)
    conn.request("GET", "/", headers={"Host": f"127.0.0.1:{browser.port}"})
    plain = conn.getresponse()
    assert plain.status == 301 and plain.getheader("Location").startswith("https://")
    conn.close()

    sign_in(browser, "alice", "alice-demo")
    req, run = server["request"], server["run"]
    pages = ["/", "/requests/", "/requests/new/", f"/requests/{req}/", f"/requests/{req}/live/", f"/runs/{run}/",
             f"/requests/{req}/reconciliation/", "/approvals/", "/catalog/", "/catalog/jobs/dwd_order_items/",
             "/lineage/", "/lineage/?root=dwd_order_items", "/datasets/dwd_order_items/", "/outbox/", "/audit/",
             "/api/docs/"]
    referenced = set()
    for path in pages:
        response, body = browser.get(path)
        assert response.status == 200, (path, response.status)
        assert response.getheader("Content-Type").startswith("text/html"), path
        referenced |= {m.decode() for m in re.findall(rb'(?:href|src)="(/static/[^"?#]+)"', body)}
    response, body = browser.get("/api/requests/")
    assert response.status == 200 and response.getheader("Content-Type").startswith("application/json")
    assert any(r["id"] == req for r in json.loads(body)["results"])

    # Every file collectstatic wrote (not its .gz twins), and every one a page links to.
    root = server["static_root"]
    collected = {"/static/" + p.relative_to(root).as_posix() for p in root.rglob("*")
                 if p.is_file() and p.suffix != ".gz"}
    assert {"/static/css/portal.css", "/static/vendor/htmx-2.0.11.min.js"} <= referenced <= collected
    assert len(collected) > 50  # the portal's and the admin's, DRF's and drf-spectacular's
    for path in sorted(collected):
        response, body = browser.get(path)
        assert response.status == 200, (path, response.status)
        expected = TYPES.get(Path(path).suffix)
        if expected:
            assert response.getheader("Content-Type").split(";")[0] == expected, path
        assert body == (root / path[len("/static/"):]).read_bytes(), path
    response, body = browser.get("/static/css/portal.css", **{"Accept-Encoding": "gzip"})
    assert response.status == 200 and response.getheader("Content-Encoding") == "gzip"
    assert response.getheader("Content-Type").startswith("text/css")
    assert browser.get("/static/css/no-such-file.css")[0].status == 404


def test_probes_and_metrics_answer_from_every_worker_process(server):
    browser = server["browser"]
    conn = http.client.HTTPConnection("127.0.0.1", browser.port, timeout=30)
    # Probes over plain HTTP (no proxy header): not redirected.
    conn.request("GET", "/healthz", headers={"Host": f"127.0.0.1:{browser.port}"})
    response = conn.getresponse()
    assert response.status == 200 and json.loads(response.read()) == {"status": "ok"}
    conn.close()
    response, body = browser.get("/readyz")
    assert response.status == 200, body
    assert json.loads(body)["failed"] == []

    from prometheus_client.parser import text_string_to_metric_families

    assert browser.get("/metrics")[0].status == 401
    # Several scrapes, answered by either gunicorn worker: the same figures every time.
    scrapes = set()
    for _ in range(6):
        response, body = browser.get("/metrics", Authorization=f"Bearer {METRICS_TOKEN}")
        assert response.status == 200
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for f in text_string_to_metric_families(body.decode()) for s in f.samples
                   if not s.name.endswith("_age_seconds")}
        scrapes.add(tuple(sorted(samples.items())))
        # The seeded request: three intervals, all three runs dispatched and queued (no worker here).
        assert samples[("backfill_runs", (("state", "queued"), ("type", "backfill")))] == 3
        assert samples[("backfill_queue_depth", (("queue", "backfill"),))] == 3
        assert samples[("backfill_requests", (("state", "running"),))] == 1
    assert len(scrapes) == 1
