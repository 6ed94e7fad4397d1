"""Intervals per second of a long request of cheap intervals through the portal, versus
bare Celery tasks doing the same warehouse statements, on the same PostgreSQL, the same
Redis (or AMQP) broker and the same worker processes, in one run, alternated.

- The portal: a request over DAYS days of `dwd_page_views_hourly` (24 intervals a day,
  PAGE_VIEWS page views an hour in the source), filed, approved and run by the worker
  through the portal's whole path (dispatch, attempts, pins, staging with the marker,
  verification checks, compare-and-set publication, audit rows, outbox), timed from
  filing until every interval is published. The job's intervals are cheap, so once a
  warm-up day has shown it, they go in bundles (EXECUTION_BUNDLE_SIZE, as for any
  user; EXECUTION_BUNDLE_SIZE=1 in the environment measures each run alone).
- Bare: one task per interval of the same hours (benchmarks/throughput_tasks.py), all
  sent at once, running the same warehouse statements through the same backend
  interface into a dataset of its own, and nothing of the portal's bookkeeping.

The gates: MAX_ACTIVE_INTERVALS (default 32) at once, the request's limit, with the
job's, its team's and its pool's limits set to let that many run: what docs/deploy.md
tells a team to set for a long request of cheap intervals. Bare Celery has no gate: it
has every interval in flight at once. Both sides put the same load on the warehouse,
one statement at a time per worker process (a bundle runs its intervals one after
another): what the gates change is how many runs share a bundle's fixed cost (its
task, its four step transactions, its dispatch), 16 on 2 worker processes at 32 at
once. REFERENCE_ACTIVE (default 8, 0 for none) runs the portal at that many at once
too, in each round, and prints its rate beside the ratio: bundles of 4 pay that fixed
cost four times as often.

Each round's sides cover hours of their own (the same number), so no side reads or
publishes over the other's. Per side: intervals per second over the whole request, and
over its first and its last tenth (by finish time) to show whether it slows down as the
request goes on. WORKERS worker processes (default 2, as `make run` starts). ROUNDS
rounds (default 5; the figures are their medians: on a shared host one side of a
round can run a fifth slower than the same side of the next).

Each side also counts the machine's busy CPU time (/proc/stat, every process: worker
processes, PostgreSQL, Redis, this driver) from its start to its end, per interval,
and the benchmark prints the medians and their ratio before the last line: what an
interval costs on each path. On a shared host the rates move with the neighbours'
load from one run to the next; the CPU an interval moves much less.

Targets: ratio portal / bare >= 0.6 (printed last as `ratio:`); the portal's last tenth
>= 0.9 of its first. Needs PostgreSQL (DATABASE_URL, WAREHOUSE_URL) and a Redis broker
(CELERY_BROKER_URL); the metadata and the warehouse are scratch databases named after
the given ones.
"""
from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from datetime import UTC, date, datetime, timedelta

from _setup import ROOT, scratch_django, scratch_warehouse

BROKER = os.environ.get("CELERY_BROKER_URL", "")
if not (os.environ.get("DATABASE_URL", "").startswith("postgres")
        and os.environ.get("WAREHOUSE_URL", "").startswith("postgres") and BROKER.startswith("redis")):
    raise SystemExit("throughput.py needs DATABASE_URL and WAREHOUSE_URL on PostgreSQL and a Redis CELERY_BROKER_URL")

DAYS = int(os.environ.get("DAYS", "25"))
ROUNDS = int(os.environ.get("ROUNDS", "5"))
WORKERS = int(os.environ.get("WORKERS", "2"))
PAGE_VIEWS = int(os.environ.get("PAGE_VIEWS", "20"))
ACTIVE = int(os.environ.get("MAX_ACTIVE_INTERVALS", "32"))
REFERENCE = int(os.environ.get("REFERENCE_ACTIVE", "8"))
FIRST = date(2022, 9, 1)
JOB = "dwd_page_views_hourly"


# A fresh warehouse database beside the given one, as scratch_django makes the metadata's.
os.environ["WAREHOUSE_URL"], _ = scratch_warehouse("throughput")
scratch_django("throughput")

import redis  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.auth.models import User  # noqa: E402
from django.db import connection  # noqa: E402

from backfill_portal.backends import get_warehouse  # noqa: E402
from backfill_portal.backfills.models import BackfillRequest, Reconciliation  # noqa: E402
from backfill_portal.backfills.services.requests import (  # noqa: E402
    backfill_request_create,
    backfill_request_decide,
    backfill_request_submit,
)
from backfill_portal.catalog.calendar import plan_intervals  # noqa: E402
from backfill_portal.catalog.models import Job, Pool, Team  # noqa: E402
from backfill_portal.celery import app  # noqa: E402
from backfill_portal.execution.models import Run  # noqa: E402
from backfill_portal.execution.queue import BACKFILL_QUEUE, broker_publish, use_publisher  # noqa: E402
from backfill_portal.execution.services.dispatch import bundle_size  # noqa: E402
from backfill_portal.web.demo.sources import load_demo_sources  # noqa: E402

settings.DEBUG = False
settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"  # the approval e-mails
warehouse = get_warehouse()
SIDES = 3 if REFERENCE else 2  # bare, the portal, the portal at REFERENCE at once
last_day = FIRST + timedelta(days=SIDES * DAYS * ROUNDS + 1)
t = time.perf_counter()
load_demo_sources(warehouse, first=FIRST - timedelta(days=1), last=last_day + timedelta(days=1), orders_per_day=5,
                  page_views_per_hour=PAGE_VIEWS)
print(f"PostgreSQL: source data for {SIDES * DAYS * ROUNDS + 2} days loaded in {time.perf_counter() - t:.1f}s "
      f"({PAGE_VIEWS} page views an hour)")
job = Job.objects.select_related("dataset__team", "pool").get(name=JOB)
# The gates let the request's ACTIVE intervals run at once, as a team would set them for
# a cheap hourly job (the demo's catalog lets it run 4, in a pool of 8 slots with 2 kept
# for production): the job's limit, its team's and the pool's backfill slots. The
# reference request's own limit holds it to REFERENCE.
GATES = max(ACTIVE, REFERENCE)
Job.objects.filter(pk=job.pk).update(max_concurrent_runs=GATES)
Team.objects.filter(pk=job.dataset.team_id, max_concurrent_runs__lt=GATES).update(max_concurrent_runs=GATES)
Pool.objects.filter(pk=job.pool_id).update(slots=GATES + job.pool.reserved_for_production)
tz = job.dataset.timezone
alice, olivia = User.objects.get(username="alice"), User.objects.get(username="olivia")
admin = User.objects.get(username="admin")  # signs too past BACKFILL_ADMIN_APPROVAL_OVER intervals
done_list = redis.Redis.from_url(BROKER)


def hours(first: date, days: int = DAYS) -> tuple[str, str, list]:
    # Hours as UTC instants: a local hour can happen twice when clocks go back.
    last = datetime(first.year, first.month, first.day, tzinfo=UTC) + timedelta(days=days, hours=-1)
    start, end = f"{first.isoformat()}T00:00:00Z", last.isoformat().replace("+00:00", "Z")
    return start, end, plan_intervals(grain="hour", timezone=tz, first=start, last=end)


def rates(started: float, finished: list[float]) -> tuple[float, float, float]:
    """Intervals per second over the whole side, its first tenth and its last tenth."""
    finished = sorted(finished)
    n, tenth = len(finished), max(1, len(finished) // 10)
    whole = n / (finished[-1] - started)
    first = tenth / (finished[tenth - 1] - started)
    # A bundle's runs are published in one transaction, at one instant: a tenth that
    # short may take no time at all (the untimed warm-up day's).
    last = tenth / max(finished[-1] - finished[-tenth - 1], 1e-3)
    return whole, first, last


def busy_cpu_seconds() -> float | None:
    """CPU-seconds this machine has been busy since boot, every process together (the
    worker processes, PostgreSQL's backends, Redis, this driver): user, nice, system,
    irq and softirq time from /proc/stat; None where there is none. Between the start
    and the end of a side, divided by its intervals: what an interval cost the machine,
    a figure that time spent waiting for the CPU (another tenant of a shared host, the
    other side's leftovers) does not inflate as it does a rate."""
    try:
        with open("/proc/stat") as stat:
            user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in stat.readline().split()[1:8])
    except (OSError, ValueError):
        return None
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def cpu_per_interval(before: float | None, intervals: int) -> float | None:
    after = busy_cpu_seconds()
    return None if before is None or after is None else (after - before) * 1000 / intervals


def analyze() -> None:
    """Statistics for both databases before a timed side, as autovacuum keeps them on a
    running server: CI's PostgreSQL runs with autovacuum off, so the scratch databases'
    tables, which grow by thousands of rows a round, would never be analysed, and the
    planner would size them from their pages alone."""
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    warehouse.execute("ANALYZE")


def portal(first: date, days: int = DAYS, active: int = ACTIVE) -> tuple[float, float, float, float | None]:
    """File, approve and run a request over `days` days, `active` intervals at once;
    until every interval is published. Its rates (`rates`) and its CPU milliseconds an
    interval (`cpu_per_interval`)."""
    start, end, intervals = hours(first, days)
    analyze()
    with use_publisher(broker_publish):
        cpu0 = busy_cpu_seconds()
        t0 = time.time()
        request, _ = backfill_request_create(actor=alice, job=JOB, start=start, end=end, reason="throughput benchmark",
                                             max_active_intervals=active)
        backfill_request_submit(actor=alice, request_id=request.pk, confirm_overlap=True)
        backfill_request_decide(actor=olivia, request_id=request.pk, approve=True)
        if BackfillRequest.objects.get(pk=request.pk).status == "pending_approval":
            backfill_request_decide(actor=admin, request_id=request.pk, approve=True)
        from _setup import wait_while_request_is

        now = wait_while_request_is(request.pk, interval=0.05)  # 50 ms: little of the worker's CPU
        cpu = cpu_per_interval(cpu0, len(intervals))
    assert now == "reconciling", now
    finished = [f.timestamp() for f in Run.objects.filter(request=request, status="published")
                .values_list("finished_at", flat=True)]
    assert len(finished) == len(intervals), (len(finished), len(intervals))
    # Untimed: the request's reconciliation, which the worker computes once the last
    # interval is published, ends before the next side starts, so that no side shares
    # the workers with the work the one before it left.
    deadline = time.time() + 300
    while not Reconciliation.objects.filter(request_id=request.pk).exists():
        if time.time() > deadline:
            raise SystemExit(f"request {request.pk} was not reconciled within 5 minutes")
        time.sleep(0.2)
    return (*rates(t0, finished), cpu)


def bare(first: date, days: int = DAYS) -> tuple[float, float, float, float | None]:
    """One bare task per interval of `days` days, all sent at once; until all have
    finished. As `portal`: its rates and its CPU milliseconds an interval."""
    _, _, intervals = hours(first, days)
    analyze()
    key = f"bench:throughput:{uuid.uuid4().hex}"
    cpu0 = busy_cpu_seconds()
    t0 = time.time()
    for iv in intervals:
        app.send_task("bench.bare_interval", queue=BACKFILL_QUEUE,
                      args=[f"bare-{uuid.uuid4().hex}", iv.partition_key, iv.start.isoformat(), iv.end.isoformat(), key])
    while done_list.llen(key) < len(intervals):
        time.sleep(0.05)
    cpu = cpu_per_interval(cpu0, len(intervals))
    finished = [float(x) for x in done_list.lrange(key, 0, -1)]
    done_list.delete(key)
    return (*rates(t0, finished), cpu)


def start_worker() -> subprocess.Popen:
    """A real Celery worker, as deployed (DEBUG off, WORKERS processes), with the bare task
    loaded beside the portal's. It signs audit rows with this process's key."""
    env = {**os.environ, "LOG_LEVEL": "WARNING", "DEBUG": "0", "SECRET_KEY": "benchmark-" + "k" * 50,
           "AUDIT_KEY": f"{settings.AUDIT_KEY_ID}:{settings.AUDIT_KEYS[settings.AUDIT_KEY_ID]}",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, "-m", "celery", "-A", "backfill_portal", "purge", "-f", "-Q", "production,backfill"],
                   cwd=ROOT, env=env, capture_output=True, timeout=60)
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "backfill_portal", "worker", "-Q", "production,backfill",
         "--include", "throughput_tasks", "--concurrency", str(WORKERS), "--prefetch-multiplier", "1",
         "--without-mingle", "--without-gossip", "-n", f"throughput{os.getpid()}@%h"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + 60
    while not app.control.ping(timeout=1.0):
        if proc.poll() is not None or time.time() > deadline:
            raise SystemExit("the benchmark worker did not start")
    return proc


def stop_worker(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def line(name: str, r: tuple[float, float, float, float | None]) -> str:
    cpu = f", {r[3]:.1f} CPU-ms an interval" if r[3] is not None else ""
    return f"{name} {r[0]:.1f}/s (first tenth {r[1]:.1f}/s, last tenth {r[2]:.1f}/s{cpu})"


worker = start_worker()
portal_r, bare_r, reference_r = [], [], []
try:
    # A day of each first, untimed: the worker's processes import, connect and compile.
    bare(FIRST, 1)
    portal(FIRST + timedelta(days=1), 1)
    day = FIRST + timedelta(days=2)
    for n in range(ROUNDS):
        bare_r.append(bare(day))
        day += timedelta(days=DAYS)
        portal_r.append(portal(day))
        day += timedelta(days=DAYS)
        if REFERENCE:
            reference_r.append(portal(day, active=REFERENCE))
            day += timedelta(days=DAYS)
        print(f"round {n + 1}: {line('bare', bare_r[-1])}; {line(f'portal at {ACTIVE} at once', portal_r[-1])}"
              + (f"; {line(f'portal at {REFERENCE} at once', reference_r[-1])}" if REFERENCE else ""), flush=True)
finally:
    stop_worker(worker)

p = statistics.median(r[0] for r in portal_r)
b = statistics.median(r[0] for r in bare_r)
steady = statistics.median(r[2] / r[1] for r in portal_r)
n_intervals = len(hours(FIRST)[2])
print(f"{ROUNDS} rounds of {n_intervals} hourly intervals each side, {WORKERS} worker processes, "
      f"{ACTIVE} intervals at once (the request's, job's, team's and pool's limits): "
      f"portal {p:.1f} intervals/s, bare Celery {b:.1f}/s (medians); "
      f"portal's last tenth / first tenth: {steady:.2f} (target >= 0.9)")
if all(r[3] is not None for r in portal_r + bare_r):
    # The machine's busy CPU time an interval, every process counted: what the two
    # paths cost, less disturbed than their rates by a host that is busy elsewhere.
    pc, bc = statistics.median(r[3] for r in portal_r), statistics.median(r[3] for r in bare_r)
    print(f"CPU an interval (medians): portal {pc:.1f} ms, bare Celery {bc:.1f} ms; bare / portal {bc / pc:.2f}")
if REFERENCE:
    r = statistics.median(x[0] for x in reference_r)
    # What dispatch sized the reference requests' bundles by (their job's gates as set above).
    size = bundle_size(BackfillRequest.objects.filter(max_active_intervals=REFERENCE).latest("pk"),
                       Job.objects.select_related("dataset__team", "pool").get(name=JOB), queued=REFERENCE)
    print(f"for reference, {REFERENCE} at once (bundles of {size}): portal {r:.1f} intervals/s, "
          f"{r / b:.2f} of bare Celery")
print(f"ratio: {p / b:.2f} (portal intervals/s / bare Celery tasks doing the same warehouse statements, "
      f"{n_intervals} intervals of {JOB})")
