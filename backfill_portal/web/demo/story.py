"""The demo's first start: a published production history and, in it, the 2 a.m. incident.

What `load_demo` tells, once, through the product's own services and tasks (nothing is
written behind their backs; every step is audited as the person who took it):

1. Production history, Sep - Nov 2022: the scheduler's production run of
   `dwd_order_items` for every business day (`schedule_production` at a past clock),
   then alice's first build of the analytics layer for November (`dws_sales_daily`
   cascading to `ads_gmv_report`, the finance e-mail skipped), approved by sam and
   rita, reconciled and signed off by sam.
2. The incident: at 2 a.m. olivia deploys an append-style variant of `dwd_order_items`
   (the day's rows appended a second time under a suffixed item id, so keys stay unique
   and verification only warns), alice reruns INCIDENT_DAY with it, olivia approves, and
   the partition is published with twice its rows. Olivia reverts the catalog; the
   rerun waits in `reconciling` with its rows 2x the baseline unexplained.

A new user then finds the anomaly (`warehouse/anomalies.py`, on the home page), files
the corrective backfill of INCIDENT_DAY with the reverted code, sees before (2x) /
after / baseline on its reconciliation, and may roll the incident's request back.

The work runs in this process: the tasks the outbox sends are collected and applied
here in order (Celery's `apply`, the same task functions a worker runs), so the story
is complete when `load_demo` returns and needs no worker.
"""
from __future__ import annotations

import logging
import re
from collections import deque
from collections.abc import Callable
from contextlib import contextmanager
from datetime import date, datetime, time, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

from django.conf import settings
from django.contrib.auth import get_user_model

from backfill_portal.backfills.models import BackfillRequest
from backfill_portal.backfills.services.requests import backfill_request_create, backfill_request_decide, \
    backfill_request_submit
from backfill_portal.catalog.services.sync import catalog_sync
from backfill_portal.execution.queue import use_publisher
from backfill_portal.execution.services.schedule import schedule_production

DEMO_CATALOG = Path(__file__).resolve().parent / "catalog.yaml"
HISTORY_FIRST = date(2022, 9, 1)
# The analytics layer went live in the incident's month: its first build covers November
# (a build over the whole history would double the time load_demo takes).
ANALYTICS_FIRST = date(2022, 11, 1)
HISTORY_LAST = date(2022, 11, 30)
INCIDENT_DAY = "2022-11-22"
INCIDENT_JOB = "dwd_order_items"
HISTORY_KEY = "demo-story-analytics-build"
INCIDENT_KEY = "demo-story-incident-rerun"
BUSINESS_TZ = ZoneInfo("Asia/Shanghai")

# The append-style variant: the latest version of each item, appended a second time
# under a suffixed item id (as an INSERT of a surrogate row id would), so the business
# key stays unique and verification passes with a warning while every row and every
# amount of the day is doubled.
APPEND_STYLE_SQL = """SELECT v.order_id, v.item_id || a.copy_suffix AS item_id, v.customer_id, v.category,
       v.amount, v.status, v.event_time, v.updated_at
FROM (
  SELECT e.order_id, e.item_id, e.customer_id, e.category, e.amount, e.status,
         e.event_time, e.updated_at,
         ROW_NUMBER() OVER (
           PARTITION BY e.order_id, e.item_id
           ORDER BY e.updated_at DESC, e.event_id DESC
         ) AS version_rank
  FROM {{ ref('ods_order_events') }} AS e
  WHERE e.item_id IS NOT NULL
) AS v
CROSS JOIN (SELECT '' AS copy_suffix UNION ALL SELECT '#appended' AS copy_suffix) AS a
WHERE v.version_rank = 1
"""


class InProcessQueue:
    """Collects what the outbox sends and runs it here, in order, with Celery's `apply`
    (what it enqueues runs too)."""

    def __init__(self):
        self.sent: deque = deque()

    def publish(self, task, args, headers, queue, eta=None):
        self.sent.append((task, list(args), dict(headers)))

    def drain(self) -> int:
        from backfill_portal.celery import app
        import backfill_portal.backfills.tasks  # noqa: F401  (registers the tasks)
        import backfill_portal.execution.tasks  # noqa: F401
        import backfill_portal.recovery.tasks  # noqa: F401

        done = 0
        while self.sent:
            task, args, headers = self.sent.popleft()
            app.tasks[task].apply(args=args, headers=headers, throw=True)
            done += 1
        return done


def append_style_catalog(text: str) -> str:
    """The demo catalog with dwd_order_items' SELECT replaced by APPEND_STYLE_SQL."""
    pattern = re.compile(r"(  - name: dwd_order_items\n    produces: dwd_order_items\n(?:    .*\n)*?    sql: \|\n)"
                         r"((?:      .*\n|\n)*?)(?=\n  - name: )")
    body = "".join(f"      {line}\n" if line else "\n" for line in APPEND_STYLE_SQL.rstrip("\n").split("\n"))
    changed, n = pattern.subn(lambda m: m.group(1) + body, text, count=1)
    if n != 1:
        raise RuntimeError("the demo catalog has no dwd_order_items SQL to vary")
    return changed


def story_told() -> bool:
    return BackfillRequest.objects.filter(idempotency_key=INCIDENT_KEY).exists()


def tell_story(*, progress: Callable[[str], None] = lambda line: None) -> bool:
    """Build the history and the incident; False when an earlier start told it already.
    Each step is idempotent on its own (scheduled runs once per partition, requests by
    idempotency key), so a start interrupted half-way finishes the story the next time."""
    if story_told():
        return False
    users = {u.username: u for u in get_user_model().objects.filter(
        username__in=["alice", "olivia", "sam", "rita", "finn", "admin"])}
    queue = InProcessQueue()
    with _quietly(), use_publisher(queue.publish):
        _production_history(queue, progress)
        _analytics_build(queue, users, progress)
        _incident(queue, users, progress)
    return True


@contextmanager
def _quietly():
    """The story's log lines (hundreds of runs) and its approval e-mails (the console
    backend in development) would bury load_demo's progress lines: while it is told,
    the root logger says only warnings and the e-mails go to Django's memory outbox.
    Both are put back afterwards."""
    root = logging.getLogger()
    level, backend = root.level, settings.EMAIL_BACKEND
    root.setLevel(logging.WARNING)
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    try:
        yield
    finally:
        root.setLevel(level)
        settings.EMAIL_BACKEND = backend


def _production_history(queue: InProcessQueue, progress) -> None:
    day, n = HISTORY_FIRST, 0
    while day <= HISTORY_LAST:
        # The scheduler's clock half an hour after the business day closed in Shanghai:
        # it creates the production run of that day, as it did in 2022.
        clock = datetime.combine(day + timedelta(days=1), time(0, 30), BUSINESS_TZ)
        n += len(schedule_production(now=clock, jobs=[INCIDENT_JOB]))
        queue.drain()
        if (day + timedelta(days=1)).day == 1:
            progress(f"story: production history of {INCIDENT_JOB} published through {day:%Y-%m} ({n} runs)")
        day += timedelta(days=1)


def _approve_all(request: BackfillRequest, users: dict) -> None:
    for step in request.approval_steps.filter(status="pending").select_related("approver"):
        backfill_request_decide(actor=step.approver or users["admin"], request_id=request.pk, approve=True,
                                comment="looks right")


def _file(users: dict, requester: str, key: str, **kwargs) -> BackfillRequest:
    request, created = backfill_request_create(actor=users[requester], idempotency_key=key, **kwargs)
    if created or request.status == "draft":
        backfill_request_submit(actor=users[requester], request_id=request.pk, confirm_overlap=True)
        request.refresh_from_db()
    if request.status == "pending_approval":
        _approve_all(request, users)
    request.refresh_from_db()
    return request


def _analytics_build(queue: InProcessQueue, users: dict, progress) -> None:
    from backfill_portal.recovery.reconciliation import reconciliation_get, reconciliation_signoff

    request = _file(users, "alice", HISTORY_KEY, job="dws_sales_daily", start=ANALYTICS_FIRST.isoformat(),
                    end=HISTORY_LAST.isoformat(), cascade="cascade", node_actions={"notify_finance": "skip"},
                    max_active_intervals=8,
                    reason="The analytics layer goes live: first build of sales per category and the "
                           "finance GMV report for November 2022.")
    queue.drain()
    request.refresh_from_db()
    if request.status == "reconciling":
        reconciliation_get(request_id=request.pk)
        reconciliation_signoff(actor=users["sam"], request_id=request.pk,
                               comment="First build: every interval matched its source.")
    progress(f"story: analytics layer built and signed off (request #{request.pk})")


def _incident(queue: InProcessQueue, users: dict, progress) -> None:
    text = DEMO_CATALOG.read_text(encoding="utf-8")
    catalog_sync(text=append_style_catalog(text), actor=users["olivia"],
                 reason="INC-2211 at 02:00: switch dwd_order_items to an append-style incremental load "
                        "to pick up late events faster")
    request = _file(users, "alice", INCIDENT_KEY, job=INCIDENT_JOB, start=INCIDENT_DAY, end=INCIDENT_DAY,
                    reason="Paged at 2 a.m.: late events missing from 2022-11-22; rerun the day with the new "
                           "incremental load.")
    queue.drain()
    catalog_sync(text=text, actor=users["olivia"],
                 reason="INC-2211 revert: the append-style load appends the day a second time; back to the "
                        "deduplicating SELECT")
    progress(f"story: the 2 a.m. incident: {INCIDENT_JOB} {INCIDENT_DAY} published with doubled rows "
             f"(request #{request.pk}, waiting in reconciling)")
