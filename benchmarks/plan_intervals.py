"""Plan and persist a three-year hourly request (26,280 intervals) through the portal's
service, versus a plain bulk_create of the same Interval rows, in one run.
Target: ratio at most 1.5 on SQLite and on PostgreSQL (DATABASE_URL)."""
from __future__ import annotations

import statistics
import time

from _setup import scratch_django

label = scratch_django("plan")

from django.contrib.auth.models import User  # noqa: E402
from django.db import transaction  # noqa: E402

from backfill_portal.backfills.models import BackfillRequest, Interval  # noqa: E402
from backfill_portal.catalog.calendar import plan_intervals  # noqa: E402
from backfill_portal.backfills.services.requests import backfill_request_create  # noqa: E402
from backfill_portal.catalog.models import Job  # noqa: E402

FIRST, LAST = "2021-01-01T00:00-05:00", "2023-12-31T23:00-05:00"
alice = User.objects.get(username="alice")
job = Job.objects.get(name="dwd_page_views_hourly")


def portal() -> float:
    t = time.perf_counter()
    request, _ = backfill_request_create(actor=alice, job=job.name, start=FIRST, end=LAST, reason="benchmark")
    elapsed = time.perf_counter() - t
    assert request.interval_count == 26280, request.interval_count
    return elapsed


def plain(rows) -> float:
    """The floor: one request row and the same interval rows, bulk-inserted."""
    t = time.perf_counter()
    with transaction.atomic():
        request = BackfillRequest.objects.create(
            job=job, requested_by=alice, requested_at=rows[0].start, reason="plain", first_partition="a",
            last_partition="b", range_start=rows[0].start, range_end=rows[-1].end, interval_count=len(rows))
        Interval.objects.bulk_create(
            [Interval(request=request, job=job, position=i, partition_key=p.partition_key, start=p.start, end=p.end)
             for i, p in enumerate(rows)], batch_size=2000)
    return time.perf_counter() - t


planned = plan_intervals(grain="hour", timezone="America/New_York", first=FIRST, last=LAST)
assert len(planned) == 26280
portal_times, plain_times = [], []
for _ in range(5):
    plain_times.append(plain(planned))
    portal_times.append(portal())
p, b = statistics.median(portal_times), statistics.median(plain_times)
print(f"{label}: 26,280 hourly intervals; portal create (plan + validate + persist + audit) median {p*1000:.0f} ms, "
      f"plain bulk_create median {b*1000:.0f} ms (5 rounds each)")
print(f"ratio: {p / b:.2f} (portal create / plain bulk_create, target <= 1.5)")
