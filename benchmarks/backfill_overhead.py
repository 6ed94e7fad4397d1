"""A 90-interval backfill of dwd_order_items through the portal, versus the same SQL
run directly in a loop (delete-then-insert per partition, the "dangerous button"), in
one run. The portal path is the worker's: dispatch, attempt, pinning, staging with the
commit marker, verification checks, compare-and-set publication and the audit rows.

Two comparisons, each interleaved with the direct loop:
1. in this process, every task through Celery's `apply`, one after another: the
   governance cost per interval, with a breakdown of where it goes;
2. on PostgreSQL with a Redis or AMQP broker, through a real Celery worker (WORKERS
   processes, default 2 as `make run` starts), timed from filing the request until it
   reaches reconciling, with the CPU each side used (from /proc, on Linux).

Before each timed phase, on PostgreSQL, both sides' tables are vacuumed and analysed
and a checkpoint is taken (settle()), so that neither side pays for the other's
maintenance nor runs on a bloated table.

Prints the per-interval overhead in ms and, last, the ratio (the worker's when it
ran). Target: ratio <= 1.2 when each interval's SQL takes 50 ms or more; overhead
< 10 ms per interval on PostgreSQL + Redis. Scale with ORDERS_PER_DAY (default 12000).
"""
from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import time
from collections import deque
from datetime import date

from _setup import ROOT, scratch_django, wait_while_request_is

ORDERS = int(os.environ.get("ORDERS_PER_DAY", "12000"))
FIRST, LAST = date(2022, 9, 1), date(2022, 11, 29)
label = scratch_django("overhead")

from django.conf import settings  # noqa: E402
from django.contrib.auth.models import User  # noqa: E402
from django.db import connection  # noqa: E402

from backfill_portal.backfills.models import BackfillRequest, ReconciliationRow  # noqa: E402
from backfill_portal.catalog.calendar import plan_intervals  # noqa: E402
from backfill_portal.backfills.services.requests import (  # noqa: E402
    backfill_request_create,
    backfill_request_decide,
    backfill_request_submit,
)
from backfill_portal.catalog.models import Job  # noqa: E402
from backfill_portal.celery import app  # noqa: E402
from backfill_portal.execution import queue as outbox  # noqa: E402
from backfill_portal.backfills import tasks as backfill_tasks  # noqa: E402, F401
from backfill_portal.execution import tasks  # noqa: E402, F401
from backfill_portal.recovery import tasks as recovery_tasks  # noqa: E402, F401
from backfill_portal.execution.executors import source_sql  # noqa: E402
from backfill_portal.backends import get_warehouse  # noqa: E402
from backfill_portal.web.demo.sources import load_demo_sources  # noqa: E402

settings.DEBUG = False  # as deployed: no per-query logging
warehouse = get_warehouse()
db = warehouse  # a SQL backend: its plain statements build the direct-SQL twin
t = time.perf_counter()
load_demo_sources(db, first=FIRST, last=LAST, orders_per_day=ORDERS)
print(f"{label} warehouse ({db.dialect}): source data loaded in {time.perf_counter() - t:.1f}s, {ORDERS} orders/day")

job = Job.objects.select_related("dataset", "current_code_version").get(name="dwd_order_items")
template = job.current_code_version.definition["sql"]
intervals = plan_intervals(grain="day", timezone=job.dataset.timezone, first=FIRST.isoformat(), last=LAST.isoformat())
assert len(intervals) == 90
columns = ", ".join(f'"{c["name"]}"' for c in job.dataset.columns)
db.execute(f'CREATE TABLE IF NOT EXISTS direct_dwd_order_items AS SELECT {columns}, '
           f"'' AS ds FROM dwd_order_items WHERE 1 = 0")
# Indexed by partition, as any table rewritten partition by partition is: without it
# the loop's DELETE scans every earlier partition and the baseline looks slower than
# the SQL it stands for.
db.execute("CREATE INDEX IF NOT EXISTS direct_dwd_order_items_ds ON direct_dwd_order_items (ds)")


def settle() -> None:
    """Before each timed phase, on PostgreSQL: vacuum both sides' tables and checkpoint,
    with autovacuum off for those two tables, so that background maintenance (the
    vacuum of the loop's deleted rows, a checkpoint's page writes) is done between the
    phases instead of landing on whichever side happens to be running."""
    if db.dialect != "postgresql":
        return
    db.execute('ALTER TABLE "direct_dwd_order_items" SET (autovacuum_enabled = false)')
    # The portal's side writes each version into a table of its own and deletes nothing;
    # VACUUM of its partitioned reader table does the published ones.
    for table in ("direct_dwd_order_items", "dwd_order_items"):
        db.execute(f'VACUUM (ANALYZE) "{table}"')
    db.execute("CHECKPOINT")


class Interval:
    def __init__(self, iv):
        self.data_interval_start, self.data_interval_end = iv.start, iv.end


def direct() -> float:
    """The same SQL per interval, delete-then-insert into a plain table, no governance."""
    t0 = time.perf_counter()
    for iv in intervals:
        source = source_sql(warehouse, job.upstreams.get(), Interval(iv))
        sql = template.replace("{{ ref('ods_order_events') }}", source)
        with db.transaction():
            db.execute("DELETE FROM direct_dwd_order_items WHERE ds = ?", (iv.partition_key,))
            db.execute(f"INSERT INTO direct_dwd_order_items SELECT {columns}, ? AS ds FROM ({sql}) AS q",
                       (iv.partition_key,))
    return time.perf_counter() - t0


sent: deque = deque()


def to_this_process(task, args, headers, queue, eta=None) -> None:
    """Stands in for the broker in the in-process comparison: portal() runs what lands here."""
    sent.append((task, args, headers))


outbox.set_publisher(to_this_process)
alice, olivia = User.objects.get(username="alice"), User.objects.get(username="olivia")


def file_and_approve() -> BackfillRequest:
    request, _ = backfill_request_create(actor=alice, job=job.name, start=FIRST.isoformat(), end=LAST.isoformat(),
                                         reason="benchmark", max_active_intervals=8)
    backfill_request_submit(actor=alice, request_id=request.pk, confirm_overlap=True)
    backfill_request_decide(actor=olivia, request_id=request.pk, approve=True)
    return request


def portal() -> float:
    """Every task of the backfill run here, one after the other, through Celery's apply."""
    t0 = time.perf_counter()
    request = file_and_approve()
    while sent:
        task, args, headers = sent.popleft()
        app.tasks[task].apply(args=args, headers=headers, throw=True)
    request.refresh_from_db()
    assert request.status == "reconciling", request.status
    return time.perf_counter() - t0


BROKER = os.environ.get("CELERY_BROKER_URL", "")
ON_WORKER = connection.vendor == "postgresql" and BROKER.startswith(("redis", "amqp"))
WORKERS = int(os.environ.get("WORKERS", "2"))


def start_worker() -> subprocess.Popen:
    """A real Celery worker on the broker, as deployed: DEBUG off, WORKERS processes. With
    DEBUG off the settings require an AUDIT_KEY: the one this process signs with, so the
    benchmark's audit rows make one chain under one key."""
    env = {**os.environ, "LOG_LEVEL": "WARNING", "DEBUG": "0", "SECRET_KEY": "benchmark-" + "k" * 50,
           "AUDIT_KEY": f"{settings.AUDIT_KEY_ID}:{settings.AUDIT_KEYS[settings.AUDIT_KEY_ID]}"}
    subprocess.run([sys.executable, "-m", "celery", "-A", "backfill_portal", "purge", "-f", "-Q", "production,backfill"],
                   cwd=ROOT, env=env, capture_output=True, timeout=60)
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "backfill_portal", "worker", "-Q", "production,backfill",
         "--concurrency", str(WORKERS), "--prefetch-multiplier", "1", "--without-mingle", "--without-gossip",
         "-n", f"bench{os.getpid()}@%h"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + 60
    while not app.control.ping(timeout=1.0):
        if proc.poll() is not None or time.time() > deadline:
            raise SystemExit("the benchmark worker did not start")
    return proc


def cpu_seconds() -> dict[str, float]:
    """CPU time (user + system) used so far by PostgreSQL backends, Celery processes
    and this process, from /proc; {} where there is none."""
    used = {"postgresql": 0.0, "worker": 0.0, "this process": 0.0}
    tick = os.sysconf("SC_CLK_TCK")
    for pid in (p for p in os.listdir("/proc") if p.isdigit()) if os.path.isdir("/proc") else ():
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        seconds = (int(fields[11]) + int(fields[12])) / tick
        if int(pid) == os.getpid():
            used["this process"] += seconds
        elif cmd.startswith("postgres"):
            used["postgresql"] += seconds
        elif "celery" in cmd and "worker" in cmd:
            used["worker"] += seconds
    return used if any(used.values()) else {}


def cpu_during(fn) -> tuple[float, dict[str, float]]:
    before = cpu_seconds()
    elapsed = fn()
    after = cpu_seconds()
    return elapsed, {k: after[k] - before[k] for k in after}


def stop_worker(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def portal_on_worker() -> float:
    """The same backfill, its tasks sent through the broker to the worker; timed until
    the request reaches reconciling (every interval published)."""
    with outbox.use_publisher(outbox.broker_publish):
        t0 = time.perf_counter()
        request = file_and_approve()
        # Every 25 ms: the end is seen at most 0.3 ms per interval late.
        now = wait_while_request_is(request.pk, interval=0.025)
        elapsed = time.perf_counter() - t0
        assert now == "reconciling", now
        # Let the reconciliation task finish before anything else is timed.
        while not ReconciliationRow.objects.filter(request=request).exists():
            time.sleep(0.05)
        return elapsed


direct()  # warm caches for both (first reads of the source pages)
rounds = int(os.environ.get("ROUNDS", "3"))
direct_times, portal_times = [], []
for _ in range(rounds):  # interleaved, so that machine load hits both alike
    settle()
    direct_times.append(direct())
    settle()
    portal_times.append(portal())
d, p = statistics.median(direct_times), statistics.median(portal_times)
per_sql = d / 90 * 1000
overhead = (p - d) / 90 * 1000


def breakdown() -> str:
    """One more portal backfill, outside the timed rounds, with its SQL timed: where
    the per-interval time goes (warehouse statements, metadata queries, the rest)."""
    spent = {"staging": 0.0, "warehouse": 0.0, "metadata": 0.0, "queries": 0}

    def timed(call, statement):
        t = time.perf_counter()
        try:
            return call()
        finally:
            head = statement.lstrip()[:200]
            key = "staging" if "INSERT INTO" in head and "dwd_order_items__v" in head else "warehouse"
            spent[key] += time.perf_counter() - t

    def metadata(execute, sql, params, many, context):
        t = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            spent["metadata"] += time.perf_counter() - t
            spent["queries"] += 1

    with warehouse.execute_wrapper(timed), connection.execute_wrapper(metadata):
        total = portal()
    ms = {k: v / 90 * 1000 for k, v in spent.items() if k != "queries"}
    rest = total / 90 * 1000 - sum(ms.values())
    return (f"portal per interval: staging INSERT {ms['staging']:.0f} ms; other warehouse SQL (marker numbers and "
            f"fingerprint, source watermark, checks, pointer) {ms['warehouse']:.0f} ms; metadata SQL "
            f"{ms['metadata']:.0f} ms ({spent['queries'] / 90:.0f} queries); Python and the rest {rest:.0f} ms")


print(breakdown())
print(f"in one process, one task after another: direct SQL loop {d:.2f}s ({per_sql:.0f} ms per interval); "
      f"portal {p:.2f}s; overhead {overhead:.1f} ms per interval ({rounds} rounds, medians); ratio {p / d:.2f}")
if not ON_WORKER:
    print(f"ratio: {p / d:.2f} (portal backfill / direct SQL loop, 90 daily intervals of dwd_order_items, "
          "tasks run in this process; the real-worker comparison needs PostgreSQL and a Redis/AMQP broker)")
    raise SystemExit
worker = start_worker()
try:
    direct_w, worker_times, direct_cpu, worker_cpu = [], [], [], []
    for _ in range(rounds):
        settle()
        elapsed, cpu = cpu_during(direct)
        direct_w.append(elapsed)
        direct_cpu.append(cpu)
        settle()
        elapsed, cpu = cpu_during(portal_on_worker)
        worker_times.append(elapsed)
        worker_cpu.append(cpu)
finally:
    stop_worker(worker)
dw, w = statistics.median(direct_w), statistics.median(worker_times)
if worker_cpu[0]:
    def per_interval(samples, key):
        return statistics.median(c[key] for c in samples) / 90 * 1000

    busy = statistics.median(sum(c.values()) / (t * (os.cpu_count() or 1)) for c, t in zip(worker_cpu, worker_times))
    print(f"CPU per interval on the worker run: PostgreSQL {per_interval(worker_cpu, 'postgresql'):.0f} ms "
          f"(the direct loop's: {per_interval(direct_cpu, 'postgresql'):.0f} ms), Celery worker "
          f"{per_interval(worker_cpu, 'worker'):.0f} ms, this process {per_interval(worker_cpu, 'this process'):.0f} ms; "
          f"together {busy:.0%} of {os.cpu_count()} cores (kernel time for their sockets not included)")
print(f"on a real worker ({WORKERS} processes, {BROKER.split(':')[0]} broker, request max 8 active intervals): "
      f"direct SQL loop {dw:.2f}s; portal {w:.2f}s; overhead {(w - dw) / 90 * 1000:.1f} ms per interval "
      f"({rounds} rounds, medians; each round's: "
      f"{', '.join(f'{(p - d) / 90 * 1000:.1f}' for d, p in zip(direct_w, worker_times))} ms)")
print(f"ratio: {w / dw:.2f} (portal backfill on a real Celery worker / direct SQL loop, 90 daily intervals "
      "of dwd_order_items)")
