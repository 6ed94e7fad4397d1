"""Liveness against a real Celery worker (with its embedded scheduler) on PostgreSQL and
Redis: a poison run spaces its attempts by the backoff; a 20-s warehouse outage (the
warehouse behind a TCP proxy this test stops and starts) holds the request, which then
finishes by itself, every interval published once, without a manual retry. Skipped
(with the reason) unless CI's second pass provides PostgreSQL and Redis."""
from __future__ import annotations

import socket
import threading
import time
from urllib.parse import urlsplit, urlunsplit

import pytest
from django.conf import settings
from django.db import connection

from backfill_portal.backfills.choices import IntervalStatus, RequestStatus
from backfill_portal.backfills.models import Interval
from backfill_portal.core.models import AuditEvent
from backfill_portal.execution.choices import AttemptStatus, RunStatus
from backfill_portal.execution.models import Attempt, Run
from backfill_portal.warehouse.models import Publication, WarehouseOutage
from backfill_portal.catalog.specs import spec_for
from tests.execution.test_pipeline import approved_request
from tests.workers import BROKER, stop

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.worker,
    pytest.mark.skipif(not BROKER.startswith("redis"), reason="needs CELERY_BROKER_URL=redis://... (CI's second pass)"),
]


class TcpProxy:
    """127.0.0.1:<port> forwarding to the warehouse's PostgreSQL. `stop()` closes the
    listening socket and cuts every forwarded connection, so the warehouse refuses
    connections as a stopped server would; `start()` listens on the same port again."""

    def __init__(self, host: str, port: int):
        self.target = (host, port)
        self.port = 0
        self._listener: socket.socket | None = None
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()

    def start(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(128)
        listener.settimeout(0.2)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def stop(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        with self._lock:
            conns, self._open = self._open, set()
        for sock in conns:
            for close in (lambda: sock.shutdown(socket.SHUT_RDWR), sock.close):
                try:
                    close()
                except OSError:
                    pass

    def _accept(self, listener: socket.socket) -> None:
        while self._listener is listener:
            try:
                client, _ = listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            client.settimeout(None)
            upstream.settimeout(None)
            with self._lock:
                self._open.update((client, upstream))
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


@pytest.fixture
def needs_postgres():
    if connection.vendor != "postgresql" or not settings.WAREHOUSE_URL.startswith("postgres"):
        pytest.skip("a worker process shares PostgreSQL metadata and warehouse (DATABASE_URL, WAREHOUSE_URL)")


def wait_for(predicate, timeout: float, every: float = 0.5):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {predicate.__doc__ or predicate}")


def test_a_poison_run_on_a_real_worker_waits_between_its_attempts(personas, catalog, demo_sources, needs_postgres,
                                                                  start_worker):
    from backfill_portal.catalog.services.sync import catalog_sync
    from tests.conftest import TEST_CATALOG

    catalog_sync(text=TEST_CATALOG.replace("callable: tests.execution.jobs.order_items",
                                           "callable: tests.execution.jobs.broken"))
    worker = start_worker(name="test-worker-outage", beat="embedded", RETRY_BACKOFF_SECONDS=1)
    try:
        request = approved_request(personas, job="dwd_order_items_py", start="2022-10-01", end="2022-10-01")

        def request_failed():
            """the request failed after its last attempt"""
            request.refresh_from_db()
            return request.status == RequestStatus.FAILED

        wait_for(request_failed, timeout=90)
    finally:
        stop(worker)
    run = Run.objects.get(request=request)
    attempts = list(run.attempts.order_by("attempt_no"))
    assert run.status == RunStatus.FAILED and len(attempts) == run.job.max_attempts == 3
    assert all(a.status == AttemptStatus.FAILED and "the callable raises" in a.error for a in attempts), [a.error for a in attempts]
    # after failure n the next attempt waited at least half of 1 s * 2^(n-1)
    gaps = [(b.started_at - a.finished_at).total_seconds() for a, b in zip(attempts, attempts[1:])]
    assert gaps[0] >= 0.5 and gaps[1] >= 1.0, gaps


def test_a_20_second_warehouse_outage_is_survived_without_a_manual_retry(personas, catalog, warehouse, warehouse_url,
                                                                        needs_postgres, start_worker):
    parts = urlsplit(warehouse_url)
    proxy = TcpProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    proxy.start()
    proxied = urlunsplit((parts.scheme, f"{parts.username or 'postgres'}@127.0.0.1:{proxy.port}", parts.path,
                          parts.query, parts.fragment))
    worker = start_worker(name="test-worker-outage", warehouse_url=proxied, beat="embedded",
                          RETRY_BACKOFF_SECONDS=0.5, WAREHOUSE_PROBE_SECONDS=1, SWEEP_SECONDS=2,
                          WAREHOUSE_CONNECT_TIMEOUT=3)
    try:
        request = approved_request(personas, job="slow_items", start="2022-10-01", end="2022-10-04",
                                   max_active_intervals=2)

        def work_in_flight():
            """an attempt working against the warehouse"""
            return Attempt.objects.filter(run__request=request, status=AttemptStatus.RUNNING).exists()

        wait_for(work_in_flight, timeout=60, every=0.2)
        time.sleep(1.5)
        proxy.stop()  # the warehouse refuses connections, and the open ones are cut
        down_at = time.time()

        def outage_open():
            """the outage recorded"""
            return WarehouseOutage.objects.filter(status=WarehouseOutage.Status.OPEN).first()

        outage = wait_for(outage_open, timeout=20)
        time.sleep(max(0.0, 20 - (time.time() - down_at)))
        # Twenty seconds down: nothing failed, nothing was given up.
        request.refresh_from_db()
        assert request.status == RequestStatus.RUNNING
        assert not Interval.objects.filter(request=request, status=IntervalStatus.FAILED).exists()
        assert not Run.objects.filter(request=request, status=RunStatus.FAILED).exists()
        proxy.start()

        def request_done():
            """the request reconciling, every interval published"""
            request.refresh_from_db()
            return request.status not in (RequestStatus.RUNNING,)

        wait_for(request_done, timeout=120)
    finally:
        stop(worker)
        proxy.stop()
    assert request.status in (RequestStatus.RECONCILING, RequestStatus.COMPLETED), request.status
    assert set(Interval.objects.filter(request=request).values_list("status", flat=True)) == {IntervalStatus.PUBLISHED}
    outage.refresh_from_db()
    assert outage.status == WarehouseOutage.Status.CLOSED
    assert AuditEvent.objects.filter(action="warehouse.unreachable", object_id=str(outage.pk)).exists()
    assert AuditEvent.objects.filter(action="warehouse_outage.closed", object_id=str(outage.pk)).exists()
    # Attempts that met the outage are recorded and did not count; none was a manual retry.
    assert Attempt.objects.filter(run__request=request, outage=True).exists()
    assert not AuditEvent.objects.filter(request_id=request.pk, action__in=["request.retry_failed", "request.resume"]).exists()
    for run in Run.objects.filter(request=request, status=RunStatus.PUBLISHED):
        assert Publication.objects.filter(version__run=run).count() == 1
        profile = warehouse.profile(spec=spec_for(run.job.dataset), run_id=run.run_id)
        assert profile.duplicate_keys == 0 and profile.row_count == 120
        assert len(warehouse.read_partition("slow_items", run.partition_key)) == 120
    assert Run.objects.filter(request=request, status=RunStatus.PUBLISHED).count() == 4
