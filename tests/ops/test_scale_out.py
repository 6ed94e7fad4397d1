"""Scale-out across hosts, on one machine: three worker "hosts", each a network
namespace joined to a bridge by a veth pair, each running a Celery worker that reaches
PostgreSQL and Redis only over the bridge (through a relay on the bridge address, as
both listen on loopback). The same request shape runs on one host, then on three
(the ratio is printed); then a request of a few hundred intervals runs across all
three while one host's link is cut for a bounded time and restored: its attempts go
`lost`, are retried on the other hosts, nothing is published twice or lost, and the
request reaches reconciliation with a clean manifest. Every namespace, link and process
the test made is removed at the end.

Needs root with `ip netns` (CI's machine), PostgreSQL and Redis (CI's second pass);
skipped with the reason otherwise."""
from __future__ import annotations

import os
import selectors
import shutil
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from django.conf import settings
from django.db import connection
from django.db.models import Max, Min

from backfill_portal.backfills.choices import IntervalStatus, RequestStatus
from backfill_portal.backfills.models import Interval
from backfill_portal.recovery.reconciliation import request_manifest
from backfill_portal.catalog.services.sync import catalog_sync
from backfill_portal.core.models import AuditEvent
from backfill_portal.execution.choices import AttemptStatus, RunStatus
from backfill_portal.execution.models import Attempt, Run
from backfill_portal.execution.services.sweep import sweep_run
from backfill_portal.warehouse.models import Publication
from tests.conftest import TEST_CATALOG
from tests.execution.test_pipeline import approved_request
from tests.ops.jobs import ROWS
from tests.workers import purge, wait_until_ready

ROOT = Path(__file__).resolve().parents[2]
BROKER = os.environ.get("CELERY_BROKER_URL", "")
CUT_SECONDS = 15      # how long the link stays down
HEARTBEAT_TIMEOUT = 6  # the job's: an attempt on the cut host is lost after this

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.worker,
    pytest.mark.skipif(not BROKER.startswith("redis"), reason="needs CELERY_BROKER_URL=redis://... (CI's second pass)"),
    pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("ip"),
                       reason="network namespaces need root and iproute2's `ip`"),
]


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20, check=check)


class Relay(socketserver.ThreadingTCPServer):
    """Accepts on the bridge address and pipes each connection to a loopback service."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, bind_ip: str, target_port: int):
        self.target_port = target_port
        super().__init__((bind_ip, 0), RelayHandler)
        self.thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return self.server_address[1]

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


class RelayHandler(socketserver.BaseRequestHandler):
    def handle(self):
        upstream = socket.create_connection(("127.0.0.1", self.server.target_port), timeout=10)
        upstream.settimeout(None)
        pairs = {self.request: upstream, upstream: self.request}
        sel = selectors.DefaultSelector()
        for sock in pairs:
            sel.register(sock, selectors.EVENT_READ)
        try:
            while True:
                for key, _ in sel.select(timeout=1.0):
                    data = key.fileobj.recv(65536)
                    if not data:
                        return
                    pairs[key.fileobj].sendall(data)
        except OSError:
            return
        finally:
            sel.close()
            upstream.close()


class Hosts:
    """A bridge, and per host a namespace with a veth pair into it. Records everything
    it made so that `close` removes exactly that."""

    def __init__(self, count: int):
        tag = f"{os.getpid() % 100000:05d}"
        self.bridge = f"bfb{tag}"
        third = os.getpid() % 250
        self.gateway = f"10.231.{third}.1"
        self.names = [f"bf{tag}h{i}" for i in range(1, count + 1)]
        self.links = {name: f"bfv{tag}{i}" for i, name in enumerate(self.names, 1)}
        self.addresses = {name: f"10.231.{third}.{10 + i}" for i, name in enumerate(self.names, 1)}
        self.made_bridge = False
        self.made: list[str] = []
        self.workers: dict[str, subprocess.Popen] = {}
        self.relays: list[Relay] = []

    def build(self) -> None:
        ip("link", "add", self.bridge, "type", "bridge")
        self.made_bridge = True
        ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")
        for i, name in enumerate(self.names, 1):
            ip("netns", "add", name)
            self.made.append(name)
            inner = f"bfe{self.links[name][3:]}"
            ip("link", "add", self.links[name], "type", "veth", "peer", "name", inner)
            ip("link", "set", inner, "netns", name)
            ip("link", "set", self.links[name], "master", self.bridge)
            ip("link", "set", self.links[name], "up")
            ip("-n", name, "addr", "add", f"{self.addresses[name]}/24", "dev", inner)
            ip("-n", name, "link", "set", inner, "up")
            ip("-n", name, "link", "set", "lo", "up")

    def relay(self, target_port: int) -> int:
        relay = Relay(self.gateway, target_port)
        self.relays.append(relay)
        return relay.port

    def start_worker(self, name: str, env: dict, log_dir: Path) -> None:
        log = open(log_dir / f"{name}.log", "w")
        self.workers[name] = proc = subprocess.Popen(
            ["ip", "netns", "exec", name, sys.executable, "-m", "celery", "-A", "backfill_portal", "worker",
             "-Q", "production,backfill", "--concurrency", "1", "--prefetch-multiplier", "1", "--without-mingle",
             "--without-gossip", "--without-heartbeat", "-n", f"{name}@scaleout"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        proc.log_path = log_dir / f"{name}.log"

    def ready(self, name: str) -> None:
        """Until the host's worker answers a ping (through this process's way to the broker)."""
        wait_until_ready(self.workers[name], f"{name}@scaleout", BROKER, timeout=60)

    def cut(self, name: str) -> None:
        ip("link", "set", self.links[name], "down")

    def restore(self, name: str) -> None:
        ip("link", "set", self.links[name], "up")

    def close(self) -> None:
        for proc in self.workers.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.workers.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        for relay in self.relays:
            relay.stop()
        for name in self.made:
            ip("netns", "del", name, check=False)  # takes its end of the veth pair, and so the pair, with it
        if self.made_bridge:
            ip("link", "del", self.bridge, check=False)


@pytest.fixture
def hosts(warehouse_url, personas, tmp_path):
    if connection.vendor != "postgresql":
        pytest.skip("worker hosts need a database they can share: PostgreSQL (DATABASE_URL)")
    net = Hosts(3)
    try:
        net.build()
    except subprocess.CalledProcessError as exc:
        net.close()
        pytest.skip(f"cannot make network namespaces here: {exc.stderr.strip()}")
    try:
        db = settings.DATABASES["default"]
        pg = net.relay(int(db["PORT"] or 5432))
        redis_port = int(BROKER.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
        redis_db = BROKER.rsplit("/", 1)[1]
        redis = net.relay(redis_port)
        warehouse_db = warehouse_url.rsplit("/", 1)[1]
        net.env = {**os.environ,
                   "DATABASE_URL": f"postgres://{db['USER'] or 'postgres'}@{net.gateway}:{pg}/{db['NAME']}",
                   "WAREHOUSE_URL": f"postgresql://postgres@{net.gateway}:{pg}/{warehouse_db}",
                   "CELERY_BROKER_URL": f"redis://{net.gateway}:{redis}/{redis_db}", "LOG_LEVEL": "WARNING"}
        purge({"CELERY_BROKER_URL": BROKER})
        net.log_dir = tmp_path
        yield net
    finally:
        net.close()
        leftovers = set(ip("netns", "list").stdout.split()) & set(net.names)
        assert not leftovers, f"namespaces left behind: {leftovers}"
        assert net.bridge not in ip("link", "show").stdout


def scale_catalog() -> None:
    doc = yaml.safe_load(TEST_CATALOG)
    doc["datasets"].append({"name": "scale_items", "owner": "olivia", "team": "core-data", "timezone": "UTC",
                            "grain": "hour", "business_key": ["n"],
                            "columns": [{"name": "n", "type": "integer"}, {"name": "label", "type": "text"}]})
    doc["jobs"].append({"name": "scale_items", "produces": "scale_items", "reads": [], "kind": "python",
                        "pool": "warehouse", "max_attempts": 3, "max_concurrent_runs": 6,
                        "heartbeat_timeout_seconds": HEARTBEAT_TIMEOUT, "callable": "tests.ops.jobs.scale_items"})
    catalog_sync(text=yaml.safe_dump(doc))


def host_of(attempt: Attempt) -> str:
    return attempt.worker.split("@", 1)[0]


def run_to_the_end(request, *, timeout: float):
    """Sweep (as the scheduler would) until every interval is published; returns
    intervals per second from the first run created to the last publication."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        sweep_run(actor=None)
        request.refresh_from_db()
        if not Interval.objects.filter(request=request).exclude(status=IntervalStatus.PUBLISHED).exists():
            break
        time.sleep(0.5)
    left = Interval.objects.filter(request=request).exclude(status=IntervalStatus.PUBLISHED).count()
    assert left == 0, f"{left} interval(s) not published after {timeout}s"
    first = Run.objects.filter(request=request).aggregate(t=Min("created_at"))["t"]
    last = Publication.objects.filter(request=request).aggregate(t=Max("published_at"))["t"]
    return Interval.objects.filter(request=request).count() / (last - first).total_seconds()


def assert_published_once_each(request, warehouse, intervals: int) -> None:
    publications = Publication.objects.filter(request=request, action="publish")
    assert publications.count() == intervals
    assert publications.values("partition_key").distinct().count() == intervals
    assert Run.objects.filter(request=request).count() == intervals
    for run in Run.objects.filter(request=request):
        assert run.status == RunStatus.PUBLISHED
        rows = warehouse.read_partition("scale_items", run.partition_key)
        assert sorted(r["n"] for r in rows) == list(range(ROWS)), run.partition_key
    manifest = request_manifest(request)
    exceptions = manifest["exceptions"]
    assert manifest["versions_published"] == intervals
    assert exceptions["published_more_than_once"] == [] and exceptions["failed"] == []
    assert exceptions["still_retrying"] == []


def cut_then_restore(hosts: Hosts, name: str, request, schedule: dict, done: threading.Event) -> None:
    """Cuts host `name`'s link once it is in the middle of an attempt of `request` (at
    the latest a minute in), and restores it CUT_SECONDS later (sooner if `done`). On
    its own thread, as a network keeps its own time: the cut host may hold a row or the
    audit chain in an open transaction, and a sweep waiting on it must not hold back the
    link's return (it did: the sweep waited until TCP gave up, 16 minutes)."""
    started = time.time()
    try:
        while schedule["cut_at"] is None and not done.is_set():
            if time.time() - started > 8:
                running = [a.pk for a in Attempt.objects.filter(run__request=request, status=AttemptStatus.RUNNING)
                           if host_of(a) == name]
                if running or time.time() - started > 60:
                    hosts.cut(name)
                    schedule.update(cut_at=time.time(), caught=running)
                    break
            done.wait(0.5)
        if schedule["cut_at"] is not None:
            done.wait(max(0.0, CUT_SECONDS - (time.time() - schedule["cut_at"])))
            hosts.restore(name)
            schedule["restored_at"] = time.time()
    finally:
        connection.close()


def test_three_worker_hosts_share_a_backfill_and_survive_one_host_cut_off(personas, hosts, warehouse, capsys):
    scale_catalog()
    first, second, third = hosts.names
    hosts.start_worker(first, hosts.env, hosts.log_dir)

    # 1. One host: 36 hourly intervals.
    one = approved_request(personas, job="scale_items", start="2022-10-01T00:00Z", end="2022-10-02T11:00Z",
                           max_active_intervals=6)
    rate_one = run_to_the_end(one, timeout=240)
    assert_published_once_each(one, warehouse, 36)

    # 2. Three hosts, the same request shape.
    hosts.start_worker(second, hosts.env, hosts.log_dir)
    hosts.start_worker(third, hosts.env, hosts.log_dir)
    hosts.ready(second)
    hosts.ready(third)
    three = approved_request(personas, job="scale_items", start="2022-10-03T00:00Z", end="2022-10-04T11:00Z",
                             max_active_intervals=6)
    rate_three = run_to_the_end(three, timeout=240)
    assert_published_once_each(three, warehouse, 36)
    workers = {host_of(a) for a in Attempt.objects.filter(run__request=three)}
    assert workers == {first, second, third}, workers

    # 3. A few hundred intervals across all three; the third host's link is cut while
    #    it is in the middle of an attempt, for CUT_SECONDS, then restored.
    big = approved_request(personas, job="scale_items", start="2022-10-05T00:00Z", end="2022-10-12T23:00Z",
                           max_active_intervals=6)
    schedule = {"cut_at": None, "restored_at": None, "caught": []}
    done = threading.Event()
    fault = threading.Thread(target=cut_then_restore, args=(hosts, third, big, schedule, done), daemon=True)
    fault.start()
    try:
        rate_big = run_to_the_end(big, timeout=420)
    finally:
        done.set()
        fault.join(timeout=CUT_SECONDS + 30)
    intervals = Interval.objects.filter(request=big).count()
    assert intervals == 192
    assert_published_once_each(big, warehouse, intervals)
    assert schedule["cut_at"] and schedule["restored_at"]

    # What the cut host held was taken over by the others: an attempt it was writing goes
    # lost and is retried elsewhere; a version it had staged and was verifying (execute
    # verifies in the same task) has its verification reclaimed and verified again.
    lost = list(Attempt.objects.filter(run__request=big, status=AttemptStatus.LOST).select_related("run"))
    big_runs = [str(pk) for pk in Run.objects.filter(request=big).values_list("pk", flat=True)]
    reclaimed = AuditEvent.objects.filter(object_type="run", object_id__in=big_runs, action="run.staged",
                                          from_state=RunStatus.VERIFYING, reason__startswith="verification lost")
    assert lost or reclaimed.exists(), "the cut host's work was neither marked lost nor reclaimed"
    assert {host_of(a) for a in lost} <= {third}
    for attempt in lost:
        winner = attempt.run.attempts.get(status=AttemptStatus.SUCCEEDED)
        assert host_of(winner) != third, "a lost attempt's run was retried on the cut host"
        assert winner.attempt_no > attempt.attempt_no
    big.refresh_from_db()
    assert big.status in (RequestStatus.RECONCILING, RequestStatus.COMPLETED)
    with capsys.disabled():
        print(f"\nscale-out: 1 host {rate_one:.2f} intervals/s, 3 hosts {rate_three:.2f} intervals/s, "
              f"ratio {rate_three / rate_one:.2f}; {intervals} intervals with host {third} cut for "
              f"{CUT_SECONDS}s: {rate_big:.2f} intervals/s, {reclaimed.count()} verification(s) reclaimed, "
              f"{len(lost)} attempt(s) lost and retried on "
              f"{sorted({host_of(a.run.attempts.get(status='succeeded')) for a in lost})}, 0 published twice")
    assert rate_three > rate_one * 1.5
