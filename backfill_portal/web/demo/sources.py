"""Synthetic SOURCE data for the demo catalog (`web/demo/catalog.yaml`).

Two plain, unversioned source tables that jobs read directly:

- `ods_order_events`: e-commerce order-item events, business days cut in Asia/Shanghai.
  Each order has 1-4 items; each item has 1-3 versions (created -> paid -> shipped or
  refunded, the amount may change on the way: coupons, partial refunds). About 0.3% of
  rows carry a NULL `item_id` and about 2% arrive late (`ingested_at` 1-5 days after
  `event_time`). Orders are split per shop, so all items of one order share a category.
- `ods_page_events`: page views for America/New_York, generated hour by hour over the
  local day, so the DST days have 23 or 25 hours of data.

Data for one (dataset, local day) depends only on the seed and the day, never on the
range being loaded. Everything goes through the warehouse interface's source seam
(`WarehouseBackend.load_source`, `source_loads`, `source_sql`, `query`), so the demo
runs on every backend, Iceberg included: each day is one load keyed by the day, recorded
with its rows, so loading is idempotent and a wider range adds only the missing days.
Same seed => identical rows.
"""
from __future__ import annotations

import itertools
import multiprocessing
import random
import threading
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from datetime import date, datetime, time, timedelta, timezone
from zoneinfo import ZoneInfo

from backfill_portal.backends.base import DatasetSpec, WarehouseBackend

ORDER_EVENTS = "ods_order_events"
PAGE_EVENTS = "ods_page_events"
TIME_COLUMN = "event_time"

ORDER_TZ = ZoneInfo("Asia/Shanghai")
PAGE_TZ = ZoneInfo("America/New_York")

ORDER_COLUMNS = (
    "event_id", "order_id", "item_id", "customer_id", "category", "amount", "status",
    "event_time", "updated_at", "ingested_at",
)
PAGE_COLUMNS = ("event_id", "page", "visitor_id", "event_time", "ingested_at")
_TYPES = {"amount": "numeric", "event_time": "timestamp", "updated_at": "timestamp", "ingested_at": "timestamp"}
# The source tables as the demo catalog declares them (web/demo/catalog.yaml).
SPECS = {
    name: DatasetSpec(name=name, columns=tuple((c, _TYPES.get(c, "text")) for c in columns), business_key=("event_id",))
    for name, columns in ((ORDER_EVENTS, ORDER_COLUMNS), (PAGE_EVENTS, PAGE_COLUMNS))
}

# (category, weight, lowest price, highest price)
CATEGORIES = (
    ("electronics", 14, 49.0, 2999.0),
    ("apparel", 22, 19.0, 599.0),
    ("home", 14, 15.0, 899.0),
    ("beauty", 13, 9.9, 499.0),
    ("grocery", 16, 4.5, 199.0),
    ("books", 7, 7.9, 149.0),
    ("sports", 8, 19.0, 1199.0),
    ("toys", 6, 9.9, 399.0),
)
STATUSES = ("created", "paid", "shipped", "refunded")

# Relative order volume per Shanghai local hour: quiet nights, a lunch bump, an evening peak.
ORDER_HOUR_WEIGHTS = (
    3.0, 1.6, 0.9, 0.5, 0.4, 0.4, 0.6, 1.2, 2.2, 3.2, 3.8, 4.0,
    4.4, 4.2, 3.9, 3.8, 3.8, 3.9, 4.2, 5.0, 6.2, 7.4, 7.8, 5.6,
)
# Page views per New York local hour, relative to the hourly average.
_PAGE_CURVE = (
    0.45, 0.30, 0.22, 0.18, 0.18, 0.25, 0.45, 0.75, 1.05, 1.25, 1.35, 1.40,
    1.45, 1.40, 1.35, 1.30, 1.30, 1.35, 1.45, 1.60, 1.70, 1.60, 1.25, 0.80,
)
PAGE_HOUR_WEIGHTS = tuple(w * 24 / sum(_PAGE_CURVE) for w in _PAGE_CURVE)
PAGES = (
    ("/", 20), ("/search", 16), ("/product", 30), ("/category", 12), ("/cart", 8),
    ("/checkout", 4), ("/account", 4), ("/help", 2), ("/deals", 4),
)

NULL_ITEM_RATE = 0.003
LATE_RATE = 0.02
SINGLES_DAY_FACTOR = 1.4  # Nov 11; kept inside the catalog's ±50% row band.


# -- public API ---------------------------------------------------------------------
def load_demo_sources(
    db: WarehouseBackend,
    *,
    first: date = date(2022, 9, 1),
    last: date = date(2022, 12, 31),
    orders_per_day: int = 8000,
    page_views_per_hour: int = 400,
    seed: int = 7,
    progress: Callable[[str], None] | None = None,
) -> dict[str, int]:
    """Create the source tables if missing and load every local day in [first, last]
    not loaded yet. Returns the rows inserted per table (0s when all days were loaded).
    `progress`, when given, gets one line before the work and one per month loaded
    (the default range takes most of a minute: `make run` says what it is doing).

    A day already loaded (a load keyed by the day, `source_loads`) is skipped whatever
    the other arguments are: drop the tables to regenerate with another seed or scale."""
    if last < first:
        raise ValueError("last must not be before first")
    counts = {ORDER_EVENTS: 0, PAGE_EVENTS: 0}
    loaded = {(dataset, day) for dataset in counts for day in db.source_loads(dataset) or {}}
    todo = []
    day = first
    while day <= last:
        todo.extend((dataset, day) for dataset in counts if (dataset, day.isoformat()) not in loaded)
        day += timedelta(days=1)
    scale = {ORDER_EVENTS: orders_per_day, PAGE_EVENTS: page_views_per_hour}
    if progress is not None and todo:
        progress(f"source data: generating {len(todo)} table-days from {first} to {last} ...")
    left_in_month = Counter(f"{day:%Y-%m}" for _, day in todo)
    for dataset, day, rows in _generated(todo, scale, seed):
        counts[dataset] += _load_day(db, dataset, day, rows)
        month = f"{day:%Y-%m}"
        left_in_month[month] -= 1
        if progress is not None and left_in_month[month] == 0:
            progress(f"source data: {month} loaded ({sum(counts.values()):,} rows so far)")
    return counts


FEED_DAYS_BEHIND = 2
FEED_DAYS_AHEAD = 1


def feed_demo_sources(db: WarehouseBackend, *, now: datetime | None = None, **kwargs) -> dict[str, int]:
    """The demo's live feed: the source days around today (UTC today - 2 .. + 1, which
    holds yesterday and today in both Shanghai and New York), so the scheduler's
    production runs of the latest closed day and hour read real events instead of an
    empty interval. A whole local day is loaded at once, its later hours too: they are
    read only once they have closed. Idempotent, like every load (keyed by the day)."""
    today = (now or datetime.now(timezone.utc)).astimezone(timezone.utc).date()
    return load_demo_sources(db, first=today - timedelta(days=FEED_DAYS_BEHIND),
                             last=today + timedelta(days=FEED_DAYS_AHEAD), **kwargs)


def days_missing(db: WarehouseBackend, *, first: date, last: date) -> int:
    """How many (table, day) pairs of [first, last] are not loaded."""
    wanted = {(first + timedelta(days=i)).isoformat() for i in range((last - first).days + 1)}
    return sum(len(wanted - set(db.source_loads(dataset) or {})) for dataset in (ORDER_EVENTS, PAGE_EVENTS))


def demo_sources_loaded(db: WarehouseBackend) -> bool:
    """Whether this warehouse holds the demo's source tables (`load_demo` ran)."""
    return db.source_loads(ORDER_EVENTS) is not None


def correct_source_day(
    db: WarehouseBackend,
    *,
    day: date,
    factor_category: str,
    seed: int,
    now: datetime | None = None,
    max_rows: int = 8,
) -> int:
    """Insert a handful of late corrections for one Shanghai business day: a new version
    of up to `max_rows` existing items of `factor_category` with a changed amount,
    updated and ingested `now`. Their event_time stays inside the day, so the day's
    partition changes when recomputed. The event ids derive from (day, category, seed),
    and so does the load's key: calling again with the same arguments adds nothing.
    Returns the rows added."""
    now = now or datetime.now(timezone.utc)
    start, end = local_day_bounds(day, ORDER_TZ)
    id_prefix = f"corr-{day:%Y%m%d}-{factor_category}-s{seed}-"
    if id_prefix in (db.source_loads(ORDER_EVENTS) or {}):
        return 0
    events = db.source_sql(name=ORDER_EVENTS, time_column=TIME_COLUMN, start=start, end=end)
    rows = db.query(
        f"SELECT e.order_id, e.item_id, e.customer_id, e.category, e.amount, e.status, e.event_time,"
        f" e.updated_at, e.event_id FROM {events} AS e"
        f" WHERE e.category = ? AND e.item_id IS NOT NULL"
        f" ORDER BY e.order_id, e.item_id, e.updated_at, e.event_id",
        (factor_category,),
    )
    latest: dict[tuple[str, str], tuple] = {}
    for row in rows:
        latest[(row[0], row[1])] = row  # ordered by updated_at: the last one wins
    if not latest:
        return 0
    rng = random.Random(f"{seed}:correct:{day.isoformat()}:{factor_category}")
    picked = rng.sample(sorted(latest), min(max_rows, len(latest)))
    new_rows = []
    for n, key in enumerate(picked):
        order_id, item_id, customer_id, category, amount, status, event_time, updated_at, _ = latest[key]
        old = float(amount)
        new_amount = round(old * (0.6 + 0.35 * rng.random()), 2)
        if new_amount == old or new_amount <= 0:
            new_amount = round(old + 1.0, 2)
        updated = max(now.astimezone(timezone.utc), _as_utc(updated_at) + timedelta(seconds=1))
        new_rows.append((
            f"{id_prefix}{n:03d}", order_id, item_id, customer_id, category, new_amount, status,
            _as_utc(event_time), updated, max(updated, now.astimezone(timezone.utc)),
        ))
    return db.load_source(spec=SPECS[ORDER_EVENTS], rows=new_rows, time_column=TIME_COLUMN, load_key=id_prefix)


def local_day_bounds(day: date, tz: ZoneInfo) -> tuple[datetime, datetime]:
    """[local midnight, next local midnight) in UTC: 23 or 25 hours on DST days."""
    start = datetime.combine(day, time(), tz).astimezone(timezone.utc)
    end = datetime.combine(day + timedelta(days=1), time(), tz).astimezone(timezone.utc)
    return start, end


# -- loading ------------------------------------------------------------------------
PARALLEL_MIN_DAYS = 8  # below this, starting a generator process costs more than it saves


def _generate_day(dataset: str, day: date, scale: int, seed: int):
    """One day's rows of one source as an Arrow table (the seam's bulk path)."""
    if dataset == ORDER_EVENTS:
        return _arrow(ORDER_COLUMNS, _order_rows(day, scale, seed))
    return _arrow(PAGE_COLUMNS, _page_rows(day, scale, seed))


def _arrow(columns: tuple[str, ...], rows: list[tuple]):
    """Rows whose instants are epoch seconds -> an Arrow table of the declared types."""
    import pyarrow as pa

    values = list(zip(*rows)) if rows else [() for _ in columns]
    arrays = []
    for name, column in zip(columns, values):
        kind = _TYPES.get(name, "text")
        if kind == "timestamp":
            arrays.append(pa.array(column, pa.int64()).cast(pa.timestamp("s", tz="UTC")))
        else:
            arrays.append(pa.array(column, pa.float64() if kind == "numeric" else pa.string()))
    return pa.table(arrays, names=list(columns))


def _generated(todo: list[tuple[str, date]], scale: dict[str, int], seed: int):
    """Yield (dataset, day, rows) in `todo` order. For a long range the order events,
    the heavy part, are made in a forked child process while this one makes the page
    events and inserts, so the two overlap on a machine with more than one core.

    Fork, not spawn: spawn re-imports the caller's `__main__`, which re-runs any
    unguarded script. Fork is only safe from a single-threaded process (another
    thread may hold a lock the child would need), and a daemonic process (a Celery
    prefork worker) may not have children: in those cases everything stays here."""
    pool = None
    if (
        len(todo) >= 2 * PARALLEL_MIN_DAYS
        and threading.active_count() == 1
        and "fork" in multiprocessing.get_all_start_methods()
        and not multiprocessing.current_process().daemon
    ):
        try:
            pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("fork"))
            pool.submit(int, 0).result()  # fail here, not half-way, when processes are refused
        except Exception:  # noqa: BLE001 - any failure means: generate in-process
            if pool is not None:
                pool.shutdown(cancel_futures=True)
            pool = None
    if pool is None:
        for dataset, day in todo:
            yield dataset, day, _generate_day(dataset, day, scale[dataset], seed)
        return
    with pool:
        offloaded = iter([item for item in todo if item[0] == ORDER_EVENTS])
        ahead: deque = deque()

        def submit_next() -> None:
            for dataset, day in itertools.islice(offloaded, 1):
                ahead.append(pool.submit(_generate_day, dataset, day, scale[dataset], seed))

        for _ in range(3):  # a few days ahead, so neither process waits; bounded memory
            submit_next()
        for dataset, day in todo:
            if dataset == ORDER_EVENTS:
                rows = ahead.popleft().result()
                submit_next()
            else:
                rows = _generate_day(dataset, day, scale[dataset], seed)
            yield dataset, day, rows


def _load_day(db: WarehouseBackend, dataset: str, day: date, rows) -> int:
    """One load keyed by the day: a concurrent loader of the same day writes nothing
    (the backend records the key with the rows, atomically)."""
    return db.load_source(spec=SPECS[dataset], rows=rows, time_column=TIME_COLUMN, load_key=day.isoformat())


def _as_utc(value) -> datetime:
    if isinstance(value, datetime):
        return value.astimezone(timezone.utc)
    return datetime.strptime(value, "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc)


def _cumulative(weights) -> list[float]:
    total, out = 0.0, []
    for w in weights:
        total += w
        out.append(total)
    return out


_ORDER_HOUR_CUM = _cumulative(ORDER_HOUR_WEIGHTS)
_CATEGORY_CUM = _cumulative(c[1] for c in CATEGORIES)
_PAGE_CUM = _cumulative(p[1] for p in PAGES)
PAGE_NAMES = tuple(p[0] for p in PAGES)
_ITEMS_CUM = _cumulative((50, 28, 14, 8))  # 1..4 items per order
_VERSIONS_CUM = _cumulative((45, 35, 20))  # 1..3 versions per item


_PADDED: list[str] = []


def _padded(n: int) -> list[str]:
    """["0000000", "0000001", ...] with at least n entries: concatenating these is
    several times faster than formatting an id per row."""
    if len(_PADDED) < n:
        _PADDED.extend(f"{i:07d}" for i in range(len(_PADDED), max(n, 100_000)))
    return _PADDED


def _order_rows(day: date, orders_per_day: int, seed: int) -> list[tuple]:
    rng = random.Random(f"{seed}:{ORDER_EVENTS}:{day.isoformat()}")
    rand = rng.random
    start, end = local_day_bounds(day, ORDER_TZ)
    day_start, day_end = int(start.timestamp()), int(end.timestamp())
    last_hour = (day_end - day_start) // 3600 - 1

    factor = 1.1 if day.weekday() >= 5 else 1.0
    if (day.month, day.day) == (11, 11):
        factor = SINGLES_DAY_FACTOR
    n_orders = max(1, round(orders_per_day * factor * (0.95 + 0.1 * rand())))
    n_customers = max(50, orders_per_day * 3 // 2)
    pad = _padded(max(n_customers, n_orders * 12))

    hours = rng.choices(range(24), cum_weights=_ORDER_HOUR_CUM, k=n_orders)
    categories = rng.choices(CATEGORIES, cum_weights=_CATEGORY_CUM, k=n_orders)
    item_counts = rng.choices((1, 2, 3, 4), cum_weights=_ITEMS_CUM, k=n_orders)
    ymd = f"{day:%Y%m%d}"
    order_prefix = "o" + ymd
    suffixes = ("", "-1", "-2", "-3", "-4")

    # Versions of one item: created -> paid (minutes later; a coupon may lower the
    # amount) -> shipped or refunded (hours later; a partial refund lowers the amount).
    # An update that would fall past the business day is not modelled. Amounts are
    # kept in integer cents until the end.
    events: list[tuple] = []  # (event_time, tiebreak, order_id, item_id, customer_id, category, cents, status)
    append = events.append
    seq = 0
    for n in range(n_orders):
        order_id = order_prefix + pad[n]
        customer_id = "c" + pad[int(n_customers * rand() ** 2)]  # a core of repeat customers
        category, _, low, high = categories[n]
        span = (high - low) * 100
        low *= 100
        t0 = day_start + min(hours[n], last_hour) * 3600 + int(rand() * 3600)
        for k in range(1, item_counts[n] + 1):
            item_id = order_id + suffixes[k]
            r = rand()
            cents = int(low + span * r * r * r)
            t = t0 + k - 1
            append((t, seq, order_id, item_id, customer_id, category, cents, "created"))
            seq += 1
            r = rand()
            if r < 0.45:
                continue
            t += 20 + int(rand() * 1780)
            if t >= day_end:
                continue
            if rand() < 0.25:
                cents = cents * 9 // 10
            append((t, seq, order_id, item_id, customer_id, category, cents, "paid"))
            seq += 1
            if r < 0.80:
                continue
            t += 3600 + int(rand() * 9 * 3600)
            if t >= day_end:
                continue
            r = rand()
            if r < 0.08:
                status = "refunded"
            else:
                status = "shipped"
                if r < 0.15:
                    cents = int(cents * (0.5 + 0.4 * rand()))
            append((t, seq, order_id, item_id, customer_id, category, cents, status))
            seq += 1
    events.sort()

    event_prefix = "oe" + ymd + "-"
    not_late = 1.0 - LATE_RATE
    rows = []
    append = rows.append
    for i, (t, _, order_id, item_id, customer_id, category, cents, status) in enumerate(events):
        r = rand()
        if r < NULL_ITEM_RATE:
            item_id = None
        if r >= not_late:
            ingested = t + 86400 * (1 + int(rand() * 4)) + int(rand() * 86400)
        else:
            ingested = t + 2 + int(rand() * 600)
        # updated_at is the source row's version stamp, set with the event.
        append((event_prefix + pad[i], order_id, item_id, customer_id, category, cents / 100, status,
                t, t, ingested))
    return rows


def _page_rows(day: date, views_per_hour: int, seed: int) -> list[tuple]:
    rng = random.Random(f"{seed}:{PAGE_EVENTS}:{day.isoformat()}")
    rand = rng.random
    start, end = local_day_bounds(day, PAGE_TZ)
    day_start = int(start.timestamp())
    n_visitors = max(50, views_per_hour * 25)
    pad = _padded(max(n_visitors, views_per_hour * 25 * 3))
    event_prefix = f"pv{day:%Y%m%d}-"
    rows = []
    append = rows.append
    seq = 0
    # Walk UTC hours so the repeated (fall back) hour gets its own traffic and the
    # skipped (spring forward) hour gets none.
    for hour_start in range(day_start, int(end.timestamp()), 3600):
        local_hour = datetime.fromtimestamp(hour_start, PAGE_TZ).hour
        n = round(views_per_hour * PAGE_HOUR_WEIGHTS[local_hour] * (0.85 + 0.3 * rand()))
        seconds = sorted([int(rand() * 3600) for _ in range(n)])
        pages = rng.choices(PAGE_NAMES, cum_weights=_PAGE_CUM, k=n)
        for i in range(n):
            t = hour_start + seconds[i]
            r = rand()
            lag = 3600 + int(rand() * 5 * 3600) if r < 0.01 else 1 + int(r * 120)  # 1% late by hours
            append((event_prefix + pad[seq], pages[i], "v" + pad[int(n_visitors * rand() ** 2)], t, t + lag))
            seq += 1
    return rows
