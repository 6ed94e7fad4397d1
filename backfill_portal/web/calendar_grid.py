"""The request calendar: one row per job (cascade layer order), one column per
partition, labelled axes, a legend, each cell a link to the run that computed it.

Three layouts, chosen by size:
- strip: a row per job, a column per partition (up to STRIP_MAX_COLUMNS partitions of
  one job and CALENDAR_MAX_CELLS intervals in all);
- matrix: more partitions per job than a strip can show, up to CALENDAR_MAX_CELLS
  intervals: a block per job, a row per local day (hourly), month (daily) or year
  (monthly), a column per hour, day or month; still one cell per partition;
- buckets: above CALENDAR_MAX_CELLS intervals, each cell counts one local day (hourly),
  month (daily) or year (monthly) from one GROUP BY, laid out as month x day, year x
  month or decade x year, and links to the calendar of that bucket alone.

A published interval whose version was rolled back since (the run that published it is
`rolled_back`: execution.selectors.intervals_rolled_back) is drawn as "rolled back", not
published, struck through so that it is told apart without its colour; its counts
leave `published` for `rolled_back`, as the progress bar's do (one more query, only
when something was published).

The cells are built in Python, not in a template loop: a 26,280-interval request has
over a thousand of them, and a template loop's per-item cost dominates the page at that
size (docs/performance.md). Every value is escaped with the standard library's escape,
which is Django's without its lazy-string wrapper (the values are plain strings)."""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from html import escape
from urllib.parse import urlencode

from django.urls import reverse
from django.utils.safestring import SafeString, mark_safe

from backfill_portal.backfills.choices import IntervalStatus
from backfill_portal.backfills.selectors import interval_counts
from backfill_portal.catalog.calendar import offset_matters
from backfill_portal.catalog.lineage import LineageGraph
from backfill_portal.catalog.models import Job
from backfill_portal.execution.selectors import interval_cells, intervals_rolled_back, intervals_rolled_back_counts

CALENDAR_MAX_CELLS = 2000
# A bucket of the large calendars is a local day: the first 10 characters of a partition
# key. The intervals and the rolled-back ones are counted by it alike.
BUCKET_KEY_PREFIX = 10
STRIP_MAX_COLUMNS = 400
# Django's Choices.values builds a new list on every access: read it once.
INTERVAL_STATES = tuple(IntervalStatus.values)
# Not an interval state: a published interval whose version was rolled back since.
ROLLED_BACK = "rolled_back"
CELL_STATES = (*INTERVAL_STATES, ROLLED_BACK)
LEGEND = (("published", "published"), (ROLLED_BACK, "rolled back (published, then withdrawn)"),
          ("running", "running"), ("queued", "queued"), ("failed", "failed"), ("skipped", "skipped"),
          ("cancelled", "cancelled"), ("planned", "planned (no run yet)"))
BUCKET_LEGEND = (("partial", "partly published"),)

# Per grain: (row label, its key slice; column label, its key slice, the columns).
_MATRIX = {
    "hour": ("local day", slice(0, 10), "hour", slice(11, 13), [f"{h:02d}" for h in range(24)]),
    "day": ("month", slice(0, 7), "day", slice(8, 10), [f"{d:02d}" for d in range(1, 32)]),
    "month": ("year", slice(0, 4), "month", slice(5, 7), [f"{m:02d}" for m in range(1, 13)]),
}
# Per grain above CALENDAR_MAX_CELLS: (bucket prefix length, bucket name, row label, row
# slice of the bucket, column label, column slice, the columns).
_BUCKETS = {
    "hour": (10, "local day", "month", slice(0, 7), "day", slice(8, 10), [f"{d:02d}" for d in range(1, 32)]),
    "day": (7, "month", "year", slice(0, 4), "month", slice(5, 7), [f"{m:02d}" for m in range(1, 13)]),
    "month": (4, "year", "decade", slice(0, 3), "year", slice(3, 4), [str(y) for y in range(10)]),
}


@dataclass
class CalendarRow:
    job: str
    layer: int
    action: str  # target | rebuild | skip | handoff


@dataclass
class Calendar:
    mode: str  # strip | matrix | buckets | empty
    html: SafeString  # the <thead>/<tbody> of the table
    rows: list[CalendarRow]
    cells: int
    row_axis: str
    column_axis: str
    unit: str = ""  # what one cell counts, in buckets mode
    within: str = ""
    job: str = ""
    counts: dict[str, int] = field(default_factory=dict)  # interval states and rolled_back counted, and "total"
    legend: tuple = LEGEND

    @property
    def caption(self) -> str:
        if self.mode == "buckets":
            return (f"One cell per {self.unit} of each job ({self.cells} cells): rows are {self.row_axis}s, "
                    f"columns {self.column_axis}s; a cell opens the calendar of its {self.unit}.")
        if self.mode == "matrix":
            return (f"One cell per partition ({self.cells} in all), a block per job: rows are {self.row_axis}s, "
                    f"columns {self.column_axis}s; a cell opens its run.")
        return (f"One row per job in cascade layer order, one column per partition ({self.cells} cells); "
                "a cell opens its run.")


def request_calendar(req, *, total: int | None = None, job: Job | None = None, within: str = "") -> Calendar:
    """The calendar of `req` (narrowed to one job and a partition-key prefix when
    given). `total` is the number of intervals when the caller knows it. A request of
    one job costs one query; a cascade adds the jobs' names and grains (one more) and
    the lineage graph's freshness check."""
    job_id = job.pk if job is not None else None
    if total is None and req.interval_count > CALENDAR_MAX_CELLS and job is None and not within:
        total = req.interval_count  # the target's own intervals already exceed it
    names, grains, zones, order = _jobs(req)
    if total is None or total <= CALENDAR_MAX_CELLS:
        # One more row than a cell each can show says "aggregate" without a count first.
        rows = interval_cells(req, job_id=job_id, within=within, limit=CALENDAR_MAX_CELLS + 1)
        if len(rows) <= CALENDAR_MAX_CELLS:
            return _per_partition(req, rows, names, grains, zones, order, job=job, within=within)
    counts = interval_counts(req, key_prefix=BUCKET_KEY_PREFIX, job_id=job_id, within=within)
    return _buckets(req, counts, names, grains, order, job=job, within=within)


def _jobs(req) -> tuple[dict[int, str], dict[int, str], dict[int, str], dict[int, tuple[int, int, str]]]:
    """Names, grains, timezones, and the row order (layer, topological index, action) of
    every job the request may touch: its target and its cascade (node_actions), one query."""
    actions = dict(req.node_actions or {})
    if not actions:
        return ({req.job_id: req.job.name}, {req.job_id: req.job.dataset.grain},
                {req.job_id: req.job.dataset.timezone}, {req.job_id: (-1, 0, "target")})
    rows = list(Job.objects.filter(name__in=[req.job.name, *actions])
                .values_list("pk", "name", "dataset__grain", "dataset__timezone"))
    graph = LineageGraph.cached()
    layer = {}
    if req.job.name in graph.jobs:
        layer = dict(graph.walk(req.job.name).layer)
    names, grains, zones, order = {}, {}, {}, {}
    for pk, name, grain, zone in rows:
        names[pk], grains[pk], zones[pk] = name, grain, zone
        action = "target" if name == req.job.name else actions.get(name, "rebuild")
        order[pk] = (layer.get(name, 0) if name != req.job.name else -1, graph.topo_index.get(name, 0), action)
    return names, grains, zones, order


def _row_list(job_ids, names, order) -> list[tuple[int, CalendarRow]]:
    ids = sorted(set(job_ids), key=lambda pk: (*order.get(pk, (99, 0, ""))[:2], names.get(pk, "")))
    return [(pk, CalendarRow(job=names.get(pk, f"job {pk}"), layer=max(0, order.get(pk, (0,))[0]),
                             action=order.get(pk, (0, 0, "rebuild"))[2])) for pk in ids]


def _run_href() -> str:
    return reverse("run-detail", args=["RUN"]).replace("RUN", "{}")


def _said(state: str) -> str:
    """A cell state as a title says it (rolled_back: "rolled back")."""
    return state.replace("_", " ")


def _cell(state: str, title: str, href: str | None) -> str:
    state, title = escape(state), escape(title)
    if href is None:
        return f'<td class="c s-{state}" title="{title}"></td>'
    return f'<td class="c s-{state}"><a href="{escape(href)}" title="{title}"></a></td>'


def _count(rows_by_state: dict[str, int]) -> dict[str, int]:
    counts = dict.fromkeys(CELL_STATES, 0)
    for state, n in rows_by_state.items():
        counts[state] = counts.get(state, 0) + n
    counts["total"] = sum(rows_by_state.values())
    return counts


def _with_rollbacks(req, rows, *, job, within) -> list[tuple[int, str, str, str | None]]:
    """`rows` with the state of each published interval whose version was rolled back
    since read as rolled_back (no query when nothing was published)."""
    if not any(state == IntervalStatus.PUBLISHED for _, _, state, _ in rows):
        return rows
    rolled = set(intervals_rolled_back(req, job_id=job.pk if job is not None else None, within=within)
                 .values_list("job_id", "partition_key"))
    if not rolled:
        return rows
    return [(job_id, key, ROLLED_BACK if (job_id, key) in rolled else state, run_id)
            for job_id, key, state, run_id in rows]


def _per_partition(req, rows, names, grains, zones, order, *, job, within) -> Calendar:
    rows = _with_rollbacks(req, rows, job=job, within=within)
    by_state: dict[str, int] = {}
    for _, _, state, _ in rows:
        by_state[state] = by_state.get(state, 0) + 1
    if not rows:
        return Calendar(mode="empty", html=mark_safe(""), rows=[], cells=0, row_axis="job", column_axis="partition",
                        within=within, job=job.name if job else "", counts=_count(by_state))
    per_job: dict[int, list[tuple[str, str, str | None]]] = {}
    for job_id, key, state, run_id in rows:
        per_job.setdefault(job_id, []).append((key, state, run_id))
    ordered = _row_list(per_job, names, order)
    href = _run_href()
    widest = max(len(v) for v in per_job.values())
    if widest <= STRIP_MAX_COLUMNS:
        html = _strip_html(ordered, per_job, href, _offset_shown(per_job, grains, zones))
        return Calendar(mode="strip", html=html, rows=[r for _, r in ordered], cells=len(rows), row_axis="job",
                        column_axis="partition", within=within, job=job.name if job else "", counts=_count(by_state))
    parts = []
    row_axis = column_axis = ""
    for pk, row in ordered:
        row_axis, row_slice, column_axis, col_slice, columns = _MATRIX.get(grains.get(pk), _MATRIX["day"])
        grouped: dict[str, dict[str, list[str]]] = {}
        offsets: dict[str, list[str]] = {}
        for key, state, run_id in per_job[pk]:
            cell = _cell(state, f"{row.job} {key}: {_said(state)}" + (f" ({run_id})" if run_id else ""),
                         href.format(run_id) if run_id else None)
            grouped.setdefault(key[row_slice], {}).setdefault(key[col_slice], []).append(cell)
            if len(key) > 16:
                seen = offsets.setdefault(key[row_slice], [])
                if key[16:] not in seen:
                    seen.append(key[16:])
        # A local day whose hours carry two offsets is a DST day: its row says so, as the
        # hour columns alone would show the repeated hour as two cells under one "01".
        notes = {day: " → ".join(found) for day, found in offsets.items() if len(found) > 1}
        parts.append(_matrix_block(row, row_axis, column_axis, columns, grouped, notes))
    return Calendar(mode="matrix", html=mark_safe("".join(parts)), rows=[r for _, r in ordered], cells=len(rows),
                    row_axis=row_axis, column_axis=column_axis, within=within, job=job.name if job else "",
                    counts=_count(by_state))


def _offset_shown(per_job, grains, zones) -> set[str]:
    """The hourly keys whose column label needs its UTC offset: those where the clocks
    change (the repeated autumn hour, either side of the skipped spring one)."""
    shown = set()
    for pk, cells in per_job.items():
        if grains.get(pk) == "hour" and zones.get(pk):
            shown.update(key for key, _, _ in cells
                         if key not in shown and offset_matters(timezone=zones[pk], partition_key=key))
    return shown


def _chronological(key: str) -> tuple[str, bool, str]:
    """Sort keys by local day, then in time order: hourly keys by their UTC instant, as
    a string sort puts Europe's repeated hour (02:00+02:00, then 02:00+01:00) backwards."""
    if len(key) <= 10:
        return key[:10], False, key
    return key[:10], True, datetime.fromisoformat(key).astimezone(UTC).isoformat()


def _group_label(key: str, with_offset: bool = False) -> tuple[str, str]:
    """(the column group, the column's own label) of a partition key: month and day of
    a date, local day and hour:minute of an hour (and its offset when asked), year and
    month of a month."""
    if len(key) > 10:
        if with_offset:
            return key[:10], f'{escape(key[11:16])} <span class="cal-off">{escape(key[16:])}</span>'
        return key[:10], escape(key[11:16])
    if len(key) == 10:
        return key[:7], escape(key[8:10])
    return key[:4], escape(key[5:7])


def _strip_html(ordered, per_job, href, offset_shown=frozenset()) -> SafeString:
    keys = sorted({key for cells in per_job.values() for key, _, _ in cells}, key=_chronological)
    index = {key: i for i, key in enumerate(keys)}
    groups: list[list] = []
    labels = []
    for key in keys:
        group, label = _group_label(key, key in offset_shown)
        if groups and groups[-1][0] == group:
            groups[-1][1] += 1
        else:
            groups.append([group, 1])
        labels.append(f'<th scope="col" class="cal-col" title="{escape(key)}">{label}</th>')
    head = ('<thead><tr><th scope="col" class="cal-corner" rowspan="2">Job <span aria-hidden="true">↓</span> '
            'partition <span aria-hidden="true">→</span></th>'
            + "".join(f'<th scope="colgroup" colspan="{n}" class="cal-group">{escape(g)}</th>' for g, n in groups)
            + "</tr><tr>" + "".join(labels) + "</tr></thead>")
    body = []
    for pk, row in ordered:
        cells = ['<td class="c none"></td>'] * len(keys)
        for key, state, run_id in per_job[pk]:
            cells[index[key]] = _cell(state, f"{row.job} {key}: {_said(state)}" + (f" ({run_id})" if run_id else ""),
                                      href.format(run_id) if run_id else None)
        body.append(f'<tr><th scope="row" class="cal-job">{_job_label(row)}</th>{"".join(cells)}</tr>')
    return mark_safe(head + "<tbody>" + "".join(body) + "</tbody>")


def _job_label(row: CalendarRow) -> str:
    note = "target" if row.action == "target" else f"layer {row.layer}, {row.action}"
    return f'{escape(row.job)} <span class="muted small">{escape(note)}</span>'


def _matrix_block(row: CalendarRow, row_axis: str, column_axis: str, columns: list[str],
                  grouped: dict[str, dict[str, list[str]]], notes: dict[str, str] | None = None) -> str:
    head = (f'<tr class="cal-block"><th scope="colgroup" colspan="{len(columns) + 1}" class="cal-job">'
            f'{_job_label(row)}</th></tr>'
            f'<tr><th scope="col" class="cal-corner">{escape(row_axis)} <span aria-hidden="true">↓</span> '
            f'{escape(column_axis)} <span aria-hidden="true">→</span></th>'
            + "".join(f'<th scope="col" class="cal-col">{escape(c)}</th>' for c in columns) + "</tr>")
    body = []
    for period in sorted(grouped):
        slots = grouped[period]
        cells = []
        for c in columns:
            found = slots.get(c)
            if not found:
                cells.append('<td class="c none"></td>')
            elif len(found) == 1:
                cells.append(found[0])
            else:  # the repeated autumn hour: two partitions in one slot, side by side
                cells.append('<td class="c multi"><table class="cal-inner"><tr>'
                             + "".join(found) + "</tr></table></td>")
        note = (notes or {}).get(period)
        label = escape(period) + (f' <span class="cal-off">UTC{escape(note)}</span>' if note else "")
        body.append(f'<tr><th scope="row" class="cal-row">{label}</th>{"".join(cells)}</tr>')
    return "<tbody>" + head + "".join(body) + "</tbody>"


def bucket_state(counts: dict[str, int], total: int) -> str:
    """The state that most needs attention colours a bucket."""
    for state in ("failed", "running", "queued", ROLLED_BACK):
        if counts.get(state):
            return state
    if counts.get("published", 0) == total:
        return "published"
    if counts.get("planned"):
        return "partial" if counts.get("published") else "planned"
    for state in ("cancelled", "skipped"):
        if counts.get(state):
            return state
    return "planned"


def _buckets(req, rows, names, grains, order, *, job, within) -> Calendar:
    """rows: (job_id, local-day prefix, status, count) from one GROUP BY; re-bucketed
    here to each job's unit (a day of hourly partitions, a month of daily ones). The
    rolled-back ones leave published for rolled_back, counted by a second GROUP BY
    when something was published."""
    if any(state == IntervalStatus.PUBLISHED for _, _, state, _ in rows):
        rolled = intervals_rolled_back_counts(req, key_prefix=BUCKET_KEY_PREFIX,
                                              job_id=job.pk if job is not None else None, within=within)
        rows = [*rows, *((job_id, day, state, sign * n) for job_id, day, n in rolled
                         for state, sign in ((IntervalStatus.PUBLISHED.value, -1), (ROLLED_BACK, 1)))]
    per_job: dict[int, dict[str, dict[str, int]]] = {}
    by_state: dict[str, int] = {}
    for job_id, day, state, n in rows:
        prefix = _BUCKETS.get(grains.get(job_id), _BUCKETS["day"])[0]
        bucket = per_job.setdefault(job_id, {}).setdefault(day[:prefix], {})
        bucket[state] = bucket.get(state, 0) + n
        by_state[state] = by_state.get(state, 0) + n
    ordered = _row_list(per_job, names, order)
    base = reverse("request-calendar", args=[req.pk])
    parts, cells = [], 0
    unit = row_axis = column_axis = ""
    states = CELL_STATES
    for pk, row in ordered:
        _, unit, row_axis, row_slice, column_axis, col_slice, columns = _BUCKETS.get(grains.get(pk), _BUCKETS["day"])
        grouped: dict[str, dict[str, list[str]]] = {}
        for bucket, counts in per_job[pk].items():
            total = sum(counts.values())
            summary = ", ".join(f"{counts[s]} {_said(s)}" for s in states if counts.get(s))
            href = base + "?" + urlencode({"job": row.job, "within": bucket})
            grouped.setdefault(bucket[row_slice], {}).setdefault(bucket[col_slice], []).append(
                _cell(bucket_state(counts, total), f"{row.job} {bucket}: {total} intervals, {summary}", href))
            cells += 1
        parts.append(_matrix_block(row, row_axis, column_axis, columns, grouped))
    return Calendar(mode="buckets", html=mark_safe("".join(parts)), rows=[r for _, r in ordered], cells=cells,
                    row_axis=row_axis, column_axis=column_axis, unit=unit, within=within,
                    job=job.name if job else "", counts=_count(by_state), legend=LEGEND + BUCKET_LEGEND)
