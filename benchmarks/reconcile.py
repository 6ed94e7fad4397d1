"""Reconciliation of a 2,000-interval request of dwd_order_items with 1M rows in the
warehouse, through the real service (`reconciliation_compute`: manifest, four numbers,
baselines, watermarks, downstream values, the rows written and the audit row), versus
the bare aggregate queries that compute the same numbers from the rows (the grouped
profile of every before and after version, the downstream pointers and sums), run
directly, in one run. The portal itself no longer scans the rows here: each version's
commit marker holds its numbers, taken when it was staged (that cost is in
backfill_overhead.py); the time of reading them is printed too.

The data is built fast rather than by 2,000 real runs: each version staged and published
through the warehouse backend's own operations (`stage_rows`, `publish`: rows, commit
marker with its numbers, pointer and history, many to a transaction), and the metadata
rows (runs, versions, publications, consumption, checks) bulk-created to look exactly
as the pipeline leaves them. Each interval has a "before" version (current at
submission) and an "after" version (this request's), ROWS_PER_VERSION rows each, and a
published dws_sales_daily partition built on the after version.

Prints the times and, last, the ratio. Target: ratio <= 1.5.
"""
from __future__ import annotations

import os
import random
import statistics
import time
from datetime import date, timedelta

from _setup import scratch_django

INTERVALS = int(os.environ.get("INTERVALS", "2000"))
ROWS_PER_VERSION = int(os.environ.get("ROWS_PER_VERSION", "250"))  # x2 versions x 2,000 = 1M rows
ROUNDS = int(os.environ.get("ROUNDS", "3"))
label = scratch_django("reconcile")

from django.contrib.auth.models import User  # noqa: E402
from django.db import transaction  # noqa: E402
from django.utils import timezone  # noqa: E402

from backfill_portal.backfills.models import BackfillRequest, Interval, ReconciliationRow  # noqa: E402
from backfill_portal.recovery.reconciliation import reconciliation_compute  # noqa: E402
from backfill_portal.backfills.services.requests import backfill_request_create  # noqa: E402
from backfill_portal.catalog.models import Dataset, Job  # noqa: E402
from backfill_portal.execution.models import CheckResult, Run  # noqa: E402
from backfill_portal.backends import get_warehouse  # noqa: E402
from backfill_portal.catalog.specs import spec_for  # noqa: E402
from backfill_portal.warehouse.models import Consumption, Publication, Version  # noqa: E402

warehouse = get_warehouse()
alice = User.objects.get(username="alice")
job = Job.objects.select_related("dataset", "current_code_version").get(name="dwd_order_items")
down_job = Job.objects.select_related("dataset", "current_code_version").get(name="dws_sales_daily")
source = Dataset.objects.get(name="ods_order_events")
dwd, dws = job.dataset, down_job.dataset
spec, down_spec = spec_for(dwd), spec_for(dws)
warehouse.ensure_dataset(spec)
warehouse.ensure_dataset(down_spec)
CATEGORIES = ["electronics", "apparel", "home", "beauty", "grocery", "books", "sports", "toys"]

# -- build ------------------------------------------------------------------------------------
t0 = time.perf_counter()
FIRST = date(2017, 1, 1)
request, _ = backfill_request_create(actor=alice, job=job.name, start=FIRST.isoformat(),
                                     end=(FIRST + timedelta(days=INTERVALS - 1)).isoformat(),
                                     reason="benchmark: reconcile")
intervals = list(Interval.objects.filter(request=request).order_by("position"))
assert len(intervals) == INTERVALS, len(intervals)
submitted = timezone.now()
before_at, after_at = submitted - timedelta(days=1), submitted + timedelta(hours=1)
BackfillRequest.objects.filter(pk=request.pk).update(
    status="reconciling", submitted_at=submitted, code_version=job.current_code_version)
Interval.objects.filter(request=request).update(status="published", code_version=job.current_code_version)


def new_runs(jobx, run_type, status, req=None, tag=""):
    return [Run(run_id=f"run_{tag}{iv.position:06d}", job=jobx, run_type=run_type, request=req,
                interval=iv if req else None, partition_key=iv.partition_key, data_interval_start=iv.start,
                data_interval_end=iv.end, code_version=jobx.current_code_version, status=status)
            for iv in intervals]


with transaction.atomic():
    before_runs = Run.objects.bulk_create(new_runs(job, "scheduled", "superseded", tag="b"), batch_size=1000)
    after_runs = Run.objects.bulk_create(new_runs(job, "backfill", "published", request, tag="a"), batch_size=1000)
    down_runs = Run.objects.bulk_create(new_runs(down_job, "scheduled", "published", tag="d"), batch_size=1000)

rng = random.Random(7)
sums, fingerprints = {}, {}
BATCH = 100  # versions per warehouse transaction: few commits, few advisory locks held at once


def staged(run, spec_, rows, *, expected=None):
    marker = warehouse.stage_rows(spec=spec_, run_id=run.run_id, attempt_no=1, partition=run.partition_key, rows=rows)
    warehouse.publish(spec_or_name=spec_, partition=run.partition_key, run_id=run.run_id, expected_run_id=expected,
                      actor="bench")
    fingerprints[run.run_id] = marker.fingerprint


for start in range(0, INTERVALS, BATCH):
    with warehouse.transaction():
        for before, after, down in zip(*(runs[start:start + BATCH] for runs in (before_runs, after_runs, down_runs))):
            for run, expected in ((before, None), (after, before.run_id)):
                rows, total = [], 0.0
                for i in range(ROWS_PER_VERSION):
                    amount = round(rng.uniform(5, 900), 2)
                    total += amount
                    rows.append((f"o{run.partition_key}-{i // 2}", f"i{i % 2}", f"c{i % 97}", CATEGORIES[i % 8],
                                 amount, "paid", submitted, submitted))
                staged(run, spec, rows, expected=expected)
                sums[run.run_id] = total
            staged(down, down_spec, [(down.partition_key, c, 1, 2, round(rng.uniform(100, 9000), 2))
                                     for c in CATEGORIES])

with transaction.atomic():
    made = Version.objects.bulk_create(
        [Version(run=r, dataset=dws if r.job_id == down_job.pk else dwd, partition_key=r.partition_key,
                 row_count=len(CATEGORIES) if r.job_id == down_job.pk else ROWS_PER_VERSION,
                 fingerprint=fingerprints[r.run_id],
                 committed_attempt=1, committed_at=submitted) for r in (*before_runs, *after_runs, *down_runs)],
        batch_size=1000)
    by_run = {v.run_id: v for v in made}
    Publication.objects.bulk_create(
        [Publication(dataset=dwd, partition_key=b.partition_key, version=by_run[b.pk], published_at=before_at)
         for b in before_runs]
        + [Publication(dataset=dwd, partition_key=a.partition_key, version=by_run[a.pk],
                       previous_version=by_run[b.pk], request=request, published_at=after_at)
           for a, b in zip(after_runs, before_runs)]
        + [Publication(dataset=dws, partition_key=d.partition_key, version=by_run[d.pk], published_at=after_at)
           for d in down_runs], batch_size=1000)
    # Every 10th day the source changed between the two runs: labelled recomputed.
    Consumption.objects.bulk_create(
        [Consumption(run=r, dataset=source, partition_key=r.partition_key, pinned_at=submitted,
                     watermark={"row_count": 1000 + int(changed and i % 10 == 0), "max_ingested_at": "x",
                                "measure": 1.0})
         for changed, runs in ((False, before_runs), (True, after_runs)) for i, r in enumerate(runs)]
        + [Consumption(run=d, dataset=dwd, partition_key=d.partition_key, version=by_run[a.pk], pinned_at=submitted)
           for d, a in zip(down_runs, after_runs)], batch_size=1000)
    CheckResult.objects.bulk_create(
        [CheckResult(run=a, name="measure_vs_source", passed=True, checked_at=submitted,
                     observed={"measure": "amount", "version": sums[a.run_id], "source": sums[a.run_id]})
         for a in after_runs], batch_size=1000)
total_rows = sum(n.row_count for n in warehouse.profile_many(spec=spec, run_ids=[r.run_id for r in (*before_runs, *after_runs)]).values())
print(f"{label} metadata, {warehouse.dialect} warehouse: {INTERVALS} intervals, {total_rows:,} dwd rows "
      f"built in {time.perf_counter() - t0:.1f}s")

# -- measure ----------------------------------------------------------------------------------
run_ids = sorted(r.run_id for r in (*before_runs, *after_runs))
down_ids = sorted(r.run_id for r in down_runs)
partitions = [iv.partition_key for iv in intervals]


def bare() -> float:
    """The four numbers' warehouse work done without the portal, issued directly: the
    grouped profile of every before and after version, the downstream pointers and
    sums. (The portal reads the numbers from the commit markers instead, taken when
    each version was staged; `markers_only` below times that read.)"""
    t = time.perf_counter()
    for i in range(0, len(run_ids), 500):
        chunk = run_ids[i:i + 500]
        for statement in warehouse.profile_statements(spec, chunk):
            warehouse.query(statement, chunk)
    for i in range(0, len(partitions), 500):
        warehouse.current_many(dws.name, partitions[i:i + 500])
    for i in range(0, len(down_ids), 500):
        chunk = down_ids[i:i + 500]
        warehouse.query(warehouse.measure_statement(down_spec, chunk), chunk)
    return time.perf_counter() - t


def markers_only() -> float:
    t = time.perf_counter()
    for ids in (run_ids, down_ids):
        for i in range(0, len(ids), 500):
            warehouse.markers(ids[i:i + 500])
    for i in range(0, len(partitions), 500):
        warehouse.current_many(dws.name, partitions[i:i + 500])
    return time.perf_counter() - t


def portal() -> float:
    t = time.perf_counter()
    reconciliation_compute(actor=None, request_id=request.pk)
    return time.perf_counter() - t


portal()  # warm both: first reads of the pages, first queries of the ORM
bare()
rows = {r.partition_key: r for r in ReconciliationRow.objects.filter(request=request)}
assert len(rows) == INTERVALS
sample = rows[intervals[5].partition_key]
assert (sample.rows_before, sample.rows_after, sample.distinct_keys) == (ROWS_PER_VERSION,) * 3, sample.__dict__
assert sample.downstream_reads_after and sample.downstream_value is not None and sample.measure_source is not None
recomputed = sum(r.recomputed for r in rows.values())
assert recomputed == INTERVALS // 10, recomputed
bare_times, portal_times = [], []
for _ in range(ROUNDS):
    bare_times.append(bare())
    portal_times.append(portal())
b, p = statistics.median(bare_times), statistics.median(portal_times)
m = statistics.median(markers_only() for _ in range(ROUNDS))
print(f"the same numbers read from the commit markers (what the portal's warehouse reads are): {m:.3f}s")
print(f"bare aggregate queries: {b:.2f}s; reconciliation_compute: {p:.2f}s "
      f"({(p - b) / INTERVALS * 1000:.2f} ms per interval on top; {ROUNDS} rounds, medians; "
      f"{recomputed} intervals recomputed)")
print(f"ratio: {p / b:.2f} (reconciliation / bare aggregate queries, {INTERVALS} intervals, {total_rows:,} rows)")
