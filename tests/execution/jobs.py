"""Python callables used by the test catalog's python jobs."""
from __future__ import annotations

CRASH = {"after_fraction": None, "times": 0, "let_through": 0}
# Partitions whose rows order_items gives twice (duplicate business keys: the
# unique_business_key check fails them), and partitions whose running attempt it has
# marked lost, as the sweeper would, before it writes (its result is then fenced).
DUPLICATE: set[str] = set()
LOSE: set[str] = set()


def order_items(context):
    """Latest version per (order_id, item_id), like the SQL job, in Python.
    CRASH makes the first attempts die part-way through, after writing rows."""
    rows = context.read("ods_order_events")
    latest: dict = {}
    for r in rows:
        if r["item_id"] is None:
            continue
        key = (r["order_id"], r["item_id"])
        rank = (str(r["updated_at"]), r["event_id"])
        if key not in latest or rank > latest[key][0]:
            latest[key] = (rank, r)
    out = [{"order_id": r["order_id"], "item_id": r["item_id"], "category": r["category"], "amount": r["amount"]}
           for _, r in sorted(latest.values(), key=lambda x: (x[1]["order_id"], x[1]["item_id"]))]
    if context.partition_key in DUPLICATE:
        out = out + out[:1]
    if context.partition_key in LOSE:
        LOSE.discard(context.partition_key)
        _lose(context)
    limit = None
    if CRASH["let_through"] > 0:
        CRASH["let_through"] -= 1
    elif CRASH["times"] > 0 and CRASH["after_fraction"] is not None:
        CRASH["times"] -= 1
        limit = int(len(out) * CRASH["after_fraction"])
    for i, row in enumerate(out):
        if limit is not None and i == limit:
            raise RuntimeError(f"worker died after writing {i} of {len(out)} rows")
        yield row


def _lose(context) -> None:
    from backfill_portal.execution.models import Attempt
    from backfill_portal.execution.services.runs import attempt_fail

    attempt = Attempt.objects.select_related("run__job__dataset").get(run__run_id=context.run_id, status="running")
    attempt_fail(attempt=attempt, run=attempt.run, to="lost", error="heartbeat expired: the test's sweeper")


def broken(context):
    raise ValueError("the callable raises")
    yield  # pragma: no cover


SLOW_ROWS = 120
SLOW_SECONDS_PER_ROW = 0.05


def slow_items(context):
    """Six seconds of work, so a test can kill or stop the worker in the middle."""
    import time

    for n in range(SLOW_ROWS):
        time.sleep(SLOW_SECONDS_PER_ROW)
        yield {"n": n, "label": f"{context.partition_key}-{n}"}


def random_sample(context):
    """A deliberately non-deterministic job: a random sample of the latest items, as an
    analyst's "take 80% of the orders" notebook would. Second-rerun verification must
    catch it: the same inputs give a different version each time."""
    import random

    for row in order_items(context):
        if random.random() < 0.8:
            yield row


def quick_items(context):
    """The same 120 rows as slow_items, at once (for faults outside the attempt)."""
    for n in range(SLOW_ROWS):
        yield {"n": n, "label": f"{context.partition_key}-{n}"}


MILLION_ROWS = 1_000_000


def million_items(context):
    """A 1,000,000-row partition, as fast as Python makes it: the one a test kills the
    worker in the middle of writing (tests/execution/test_worker_iceberg.py)."""
    label = f"{context.partition_key}-"
    for n in range(MILLION_ROWS):
        yield (n, label + str(n))


def slow_from_october_4(context):
    """quick_items before 2022-10-04 (a history of cheap runs), slow_items from then on
    (the work a test kills a bundle's worker in the middle of)."""
    yield from (quick_items if context.partition_key < "2022-10-04" else slow_items)(context)
