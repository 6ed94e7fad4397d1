"""The keyed audit chain's costs, on a scratch database (SQLite, or PostgreSQL when
DATABASE_URL names it):

- audit_record: time per event, in transactions of one event (what most changes do);
  the HMAC beside the plain SHA-256 the chain used before, on the same fields;
- verify_audit's walk (audit_check): time per event over the whole log;
- anchor_audit: the first anchor (a walk of everything) and a later one after BATCH
  more events (a walk of those only, plus one COUNT).

N (default 20000) events; prints one line per figure. The scratch database is left
for the operating system's temp cleaner (SQLite) or dropped at the next run (PostgreSQL).
"""
from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _setup import scratch_django

N = int(os.environ.get("N", "20000"))
BATCH = int(os.environ.get("BATCH", "500"))

os.environ.setdefault("AUDIT_ANCHOR_PATH", str(Path(tempfile.mkdtemp(prefix="bench_anchor_")) / "anchors.jsonl"))
label = scratch_django("audit_chain")

from django.conf import settings  # noqa: E402
from django.db import transaction  # noqa: E402

from backfill_portal.core.models import AuditEvent  # noqa: E402
from backfill_portal.core.services.audit import (  # noqa: E402
    audit_anchor, audit_check, audit_record, event_hash, event_mac, hashed_fields)


def record(n: int) -> list[float]:
    times = []
    for i in range(n):
        t = time.perf_counter()
        with transaction.atomic():
            audit_record(actor=None, action="bench.event", object_type="bench", object_id=i,
                         reason="a benchmark event", data={"i": i, "nested": {"a": [1, 2, 3]}})
        times.append(time.perf_counter() - t)
    return times


def per(seconds: float, n: int) -> str:
    return f"{seconds / max(n, 1) * 1e6:.1f} µs/event"


times = record(N)
print(f"{label}: {AuditEvent.objects.count():,} events")
print(f"audit_record, one event per transaction: median {statistics.median(times) * 1e3:.2f} ms, "
      f"p95 {sorted(times)[int(len(times) * 0.95)] * 1e3:.2f} ms")

sample = list(AuditEvent.objects.order_by("id")[:2000])
key = settings.AUDIT_KEYS[settings.AUDIT_KEY_ID].encode()
t = time.perf_counter()
for e in sample:
    event_mac(e.prev_hash, hashed_fields(e), event_id=e.pk, key_id=e.key_id, key=key)
mac = time.perf_counter() - t
t = time.perf_counter()
for e in sample:
    event_hash(e.prev_hash, hashed_fields(e))
sha = time.perf_counter() - t
print(f"link computation: HMAC {per(mac, len(sample))}, plain SHA-256 {per(sha, len(sample))}")

t = time.perf_counter()
check = audit_check()
walk = time.perf_counter() - t
assert check.intact, check.problem
print(f"verify (whole chain, no anchor): {walk:.2f} s for {check.checked:,} events, {per(walk, check.checked)}")

t = time.perf_counter()
audit_anchor(actor=None)
first = time.perf_counter() - t
record(BATCH)
t = time.perf_counter()
audit_anchor(actor=None)
later = time.perf_counter() - t
print(f"anchor_audit: first {first:.2f} s (walks {N:,}), after {BATCH} more {later * 1e3:.0f} ms")
t = time.perf_counter()
check = audit_check()
walk = time.perf_counter() - t
assert check.intact and check.anchor is not None, check.problem
print(f"verify against the anchor: {walk:.2f} s, {per(walk, check.checked)}")
sys.exit(0)
