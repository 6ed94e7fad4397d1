"""Rows of the long tables (backfill requests, audit events, runs), rendered in Python.

In a Django template a row of these tables pays for a url tag, three date filters
and the autoescaping of every cell, which for a page of 50 rows costs many times the
page's own keyset SELECT. These filters build the same markup with the standard
library's escape (benchmarks/pages.py; the figures are in docs/performance.md).
Every value is escaped; the result is marked safe.

    {% load tables %}<tbody>{{ page.rows|request_rows }}</tbody>
"""
from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from html import escape
from urllib.parse import quote

from django import template
from django.urls import reverse
from django.utils import timezone
from django.utils.safestring import SafeString, mark_safe
from django.utils.text import Truncator

from backfill_portal.web.templatetags.timing import duration, words
from backfill_portal.web.templatetags.words import run_state_words, state_label

register = template.Library()

_PLACEHOLDER = 987654321  # matches the int and slug converters


def url_filler(name: str) -> Callable[[object], str]:
    """reverse(name, args=[value]) for many values: reversed once, then filled in."""
    head, _, tail = reverse(name, args=[_PLACEHOLDER]).rpartition(str(_PLACEHOLDER))
    return lambda value: f"{head}{quote(str(value), safe='')}{tail}"


def _time(at, label_format: str, *, title: bool = False) -> str:
    """<time> in the current timezone (UTC), as the `date` filter would show it."""
    local = timezone.localtime(at)
    shown = escape(local.strftime(label_format))
    title_attr = f' title="{escape(local.strftime("%Y-%m-%d %H:%M:%S ") + (local.tzname() or ""))}"' if title else ""
    return f'<time datetime="{escape(local.isoformat())}"{title_attr}>{shown}</time>'


@register.filter
def request_rows(rows: Iterable) -> SafeString:
    """Rows of a compact request table (backfills.selectors.request_rows loads exactly
    the columns shown); the header is backfills/partials/_request_table_head.html."""
    detail, job_page = url_filler("request-detail"), url_filler("catalog-job")
    out = []
    for r in rows:
        span = escape(r.first_partition)
        if r.last_partition != r.first_partition:
            span += f" → {escape(r.last_partition)}"
        status = escape(r.status)
        status_words = escape(state_label(r.status))
        paused = ' <span class="pill pill-paused">paused</span>' if r.paused else ""
        job = escape(r.job.name)
        out.append(
            f'<tr>\n  <td class="num"><a href="{escape(detail(r.pk))}">#{r.pk}</a></td>\n'
            f'  <td><a href="{escape(job_page(r.job.name))}">{job}</a></td>\n'
            f'  <td class="mono range">{span}</td>\n'
            f'  <td class="num">{int(r.interval_count)}</td>\n'
            f'  <td><span class="pill pill-{status}">{status_words}</span>{paused}</td>\n'
            f'  <td>{escape(r.requested_by.username)}</td>\n'
            f'  <td>{_time(r.requested_at, "%Y-%m-%d %H:%M", title=True)}</td>\n</tr>\n')
    return mark_safe("".join(out))


def _audit_object(e, run_page) -> str:
    """The event's object as a person names it: a run (or an attempt of one) by its run
    id, linked to its page, with the partition; anything else as type:id."""
    data = e.data if isinstance(e.data, dict) else {}
    run_id = data.get("run_id") if isinstance(data.get("run_id"), str) else None
    if run_id and e.object_type in ("run", "attempt"):
        attempt = (f" attempt {escape(str(data['attempt_no']))}"
                   if e.object_type == "attempt" and "attempt_no" in data else "")
        partition = f' <span class="muted">{escape(str(data["partition"]))}</span>' if data.get("partition") else ""
        return f'<a href="{escape(run_page(run_id))}">{escape(run_id)}</a>{attempt}{partition}'
    return f"{escape(e.object_type)}:{escape(e.object_id)}"


def _audit_time(e) -> str:
    """When the event happened; a timestamp that cannot be read (edited in the database
    into text that is not a time) is shown as stored, flagged."""
    if e.at is None:
        stored = getattr(e, "at_unreadable", None)
        return f'<span class="bad" title="not a time: run manage.py verify_audit">{escape(repr(stored))}</span>'
    return _time(e.at, "%Y-%m-%d %H:%M:%S")


def _audit_data(e) -> str:
    """What the event recorded beyond its columns (versions, counts, inputs read), folded."""
    if not e.data:
        return ""
    text = json.dumps(e.data, sort_keys=True, default=str, ensure_ascii=False)
    if len(text) > 2000:
        text = text[:2000] + " …"
    return f'<details class="small"><summary>data</summary><pre class="audit-data">{escape(text)}</pre></details>'


@register.filter
def audit_rows(events: Iterable) -> SafeString:
    """Rows of the audit table (core/audit.html has the header)."""
    detail, run_page = url_filler("request-detail"), url_filler("run-detail")
    out = []
    for e in events:
        denied = ' class="row-denied"' if e.action.startswith("denied.") else ""
        request = f'<a href="{escape(detail(e.request_id))}">#{e.request_id}</a>' if e.request_id else ""
        change = (f"{escape(e.from_state or '∅')} → {escape(e.to_state or '∅')}"
                  if e.from_state or e.to_state else "")
        reason = e.reason if len(e.reason) <= 400 else Truncator(e.reason).chars(400)
        out.append(
            f'<tr{denied}>\n  <td class="num">{e.pk}</td>\n'
            f'  <td>{_audit_time(e)}</td>\n'
            f'  <td>{escape(e.actor_name)}</td>\n'
            f'  <td class="mono">{escape(e.action)}</td>\n'
            f'  <td class="mono">{_audit_object(e, run_page)}</td>\n'
            f'  <td>{request}</td>\n'
            f'  <td>{escape(e.dataset)}</td>\n'
            f'  <td class="mono">{change}</td>\n'
            f'  <td class="clip" title="{escape(e.reason)}">{escape(reason)}{_audit_data(e)}</td>\n</tr>\n')
    return mark_safe("".join(out))


# --- Runs: the runs list and the on-call home --------------------------------------------


class _RunCells:
    """The cells every run table shares, with each URL reversed once per table. A run
    row is a mapping of execution.selectors.RUN_ROW_VALUES (a values() row: building
    model instances took longer than the rows' SQL)."""

    def __init__(self):
        self.run_page = url_filler("run-detail")
        self.request_page = url_filler("request-detail")

    def run(self, r, *, nowrap: bool) -> str:
        cls = "mono nowrap" if nowrap else "mono"
        return f'<td class="{cls}"><a href="{escape(self.run_page(r["run_id"]))}">{escape(r["run_id"])}</a></td>'

    def request(self, r) -> str:
        if not r["request_id"]:
            return "<td>—</td>"
        return f'<td><a href="{escape(self.request_page(r["request_id"]))}">#{int(r["request_id"])}</a></td>'


def _pill(status: str, run_type: str = "") -> str:
    """partials/_status.html."""
    return f'<span class="pill pill-{escape(status)}">{escape(run_state_words(status, run_type) or "—")}</span>'


def _error(text: str, limit: int) -> str:
    return text if len(text) <= limit else Truncator(text).chars(limit)


@register.simple_tag
def run_list_rows(rows: Iterable, stuck_ids=()) -> SafeString:
    """Rows of a runs-list table (execution/partials/_run_rows.html has the header);
    the runs whose pk is in `stuck_ids` are marked stuck."""
    cells, job_page = _RunCells(), url_filler("catalog-job")
    stuck_ids = stuck_ids or ()  # an unset template variable is ""
    out = []
    for r in rows:
        stuck = ' <span class="pill pill-failed">stuck</span>' if r["pk"] in stuck_ids else ""
        error = (f'<span class="error-text run-error">{escape(_error(r["error"], 200))}</span>' if r["error"] else "—")
        out.append(
            f'<tr data-run="{escape(r["run_id"])}">\n  {cells.run(r, nowrap=True)}\n'
            f'  <td><a href="{escape(job_page(r["job__name"]))}">{escape(r["job__name"])}</a>'
            f'<span class="muted small"> → {escape(r["job__dataset__name"])}</span></td>\n'
            f'  <td class="mono nowrap">{escape(r["partition_key"])}</td>\n'
            f'  <td>{escape(r["run_type"])}</td>\n'
            f'  <td class="nowrap">{_pill(r["status"], r["run_type"])}{stuck}</td>\n'
            f'  {cells.request(r)}\n'
            f'  <td class="nowrap">{_time(r["created_at"], "%Y-%m-%d %H:%M:%S")}</td>\n'
            f'  <td class="nowrap">{escape(duration(r["started_at"], r["finished_at"]))}</td>\n'
            f'  <td>{error}</td>\n</tr>\n')
    return mark_safe("".join(out))


@register.filter
def failing_rows(rows: Iterable) -> SafeString:
    """Rows of the on-call home's failed-runs table (core/home.html has the header)."""
    cells = _RunCells()
    out = []
    for r in rows:
        finished = _time(r["finished_at"], "%Y-%m-%d %H:%M") if r["finished_at"] else "—"
        out.append(
            f'<tr>\n  {cells.run(r, nowrap=False)}\n'
            f'  <td>{escape(r["run_type"])}</td>\n'
            f'  <td>{escape(r["job__name"])}</td>\n'
            f'  <td class="mono nowrap">{escape(r["partition_key"])}</td>\n'
            f'  <td>{_pill(r["status"], r["run_type"])}</td>\n'
            f'  <td class="nowrap">{finished}</td>\n'
            f'  {cells.request(r)}\n'
            f'  <td class="clip error-cell">{escape(_error(r["error"], 140) or "—")}</td>\n</tr>\n')
    return mark_safe("".join(out))


@register.filter
def stuck_rows(rows: Iterable) -> SafeString:
    """Rows of the on-call home's stuck-runs table: each run's `moved_at` is when it
    last showed life (execution.selectors.run_last_alive)."""
    cells, now = _RunCells(), timezone.now()
    out = []
    for r in rows:
        # How long ago, in the console's words for durations (Django's timesince
        # translates each unit: ~0.1 ms a row).
        ago = words(max((now - r["moved_at"]).total_seconds(), 0))
        out.append(
            f'<tr>\n  {cells.run(r, nowrap=False)}\n'
            f'  <td>{escape(r["run_type"])}</td>\n'
            f'  <td>{escape(r["job__name"])}</td>\n'
            f'  <td class="mono nowrap">{escape(r["partition_key"])}</td>\n'
            f'  <td>{_pill(r["status"], r["run_type"])}</td>\n'
            f'  <td class="nowrap">{_time(r["moved_at"], "%Y-%m-%d %H:%M")} ({ago} ago)</td>\n'
            f'  {cells.request(r)}\n</tr>\n')
    return mark_safe("".join(out))
