"""Interval planner: turns "first..last partition" into exact UTC data intervals.

Pure (no Django, no I/O). A partition is cut in the dataset's own timezone, so a
day is local midnight to local midnight and may be 23 or 25 hours long; nothing
here ever adds "24 hours". Arithmetic is done on UTC instants only, because
Python compares and subtracts two datetimes sharing one tzinfo by wall clock,
which is wrong across a DST change.
"""
from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from backfill_portal.core.errors import ValidationError

GRAINS = ("hour", "day", "month")
_HOUR = timedelta(hours=1)
# Strict shapes: Python 3.11's fromisoformat also takes "20221001" or week dates,
# which would make keys non-canonical and error messages confusing.
_DAY_RE = re.compile(r"\d{4}-\d{2}-\d{2}")
_MONTH_RE = re.compile(r"\d{4}-\d{2}(-\d{2})?")  # a day other than 01 gets its own message
# Years 1 and 9999 overflow once shifted to UTC or to the next partition.
_MIN_YEAR, _MAX_YEAR = 2, 9998
_LABELS = {"start": "first partition", "end": "last partition"}


@dataclass(frozen=True)
class PlannedInterval:
    """One partition: the data interval [start, end) in UTC, as the SQL must see it."""

    partition_key: str
    start: datetime  # aware, UTC
    end: datetime  # aware, UTC, exclusive
    grain: str
    timezone: str

    @property
    def hours(self) -> float:
        return (self.end - self.start) / _HOUR

    @property
    def note(self) -> str:
        """Why this interval is unusual ("" if it is not). Lazy: only previews need it,
        and computing it eagerly tripled the cost of a three-year hourly plan."""
        zone = ZoneInfo(self.timezone)
        a, b = self.start.astimezone(zone), self.end.astimezone(zone)
        if self.grain == "hour":
            if a.replace(fold=1 - a.fold).utcoffset() != a.utcoffset():
                which = "second" if a.fold else "first"
                return f"repeated local hour {a:%H:%M} {a.tzname()} ({which} occurrence)"
            if b.utcoffset() > a.utcoffset():
                return f"clocks go forward: local {a:%H:%M} {a.tzname()} to {b:%H:%M} {b.tzname()} is one real hour"
            return ""
        # Compare with whole local days, not local wall times: where midnight is skipped
        # (old America/Sao_Paulo) a day starts at 01:00 and wall times would hide the change.
        nominal = (b.date() - a.date()).days * 24
        if self.hours == nominal:
            return ""
        direction = "clocks go forward" if self.hours < nominal else "clocks go back"
        return f"{self.hours:g}-hour {self.grain} ({direction}; normally {nominal} hours)"


def _zone(timezone: str) -> ZoneInfo:
    try:
        return ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise ValidationError(f"unknown timezone {timezone!r}; use an IANA name such as 'Asia/Shanghai'",
                              field="timezone") from None


def _grain(grain: str) -> str:
    if grain not in GRAINS:
        raise ValidationError(f"unknown grain {grain!r}; expected one of {', '.join(GRAINS)}", field="grain")
    return grain


def _day_start(d: date, zone: ZoneInfo) -> datetime:
    # fold=0 is right at both edge cases: a repeated local midnight gives its first
    # occurrence, and a skipped one (e.g. old America/Sao_Paulo) maps to the first
    # instant that exists that day.
    return datetime(d.year, d.month, d.day, tzinfo=zone).astimezone(UTC)


def _next_month(d: date) -> date:
    return date(d.year + d.month // 12, d.month % 12 + 1, 1)


def _key(grain: str, local: datetime) -> str:
    if grain == "hour":
        # The offset keeps the repeated autumn hour unambiguous; seconds only appear
        # for historic LMT offsets, where dropping them would break the round trip.
        return local.isoformat(timespec="minutes" if local.second == 0 else "seconds")
    if grain == "day":
        return local.date().isoformat()
    return f"{local.year:04d}-{local.month:02d}"


def _build(grain: str, zone: ZoneInfo, bounds: list[datetime]) -> list[PlannedInterval]:
    """Pair consecutive UTC boundaries into intervals keyed by their local start."""
    return [
        PlannedInterval(_key(grain, bounds[i].astimezone(zone)), bounds[i], bounds[i + 1], grain, zone.key)
        for i in range(len(bounds) - 1)
        if bounds[i] < bounds[i + 1]  # a day can vanish entirely: it holds no data
    ]


def _bad(field: str, value, expected: str) -> ValidationError:
    return ValidationError(f"{_LABELS.get(field, field)} {str(value)!r} is not valid; expected {expected}", field=field)


def _offset(value: datetime) -> str:
    """A datetime's UTC offset as ISO writes it: "+05:30", "-04:00"."""
    minutes = int(value.utcoffset().total_seconds()) // 60
    return f"{'-' if minutes < 0 else '+'}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"


def parse_partition(*, grain: str, timezone: str, value, field: str) -> datetime:
    """Normalise a user bound to the local start of its partition.

    Bounds must name a partition exactly; silently rounding would plan data the
    requester did not ask for.
    """
    grain, zone = _grain(grain), _zone(timezone)
    label = _LABELS.get(field, field)
    if grain == "hour":
        if isinstance(value, str):
            try:
                value = datetime.fromisoformat(value)
            except ValueError:
                raise _bad(field, value, "an ISO-8601 datetime with offset, e.g. 2022-11-06T01:00-04:00") from None
        if not isinstance(value, datetime):
            raise _bad(field, value, "an ISO-8601 datetime with offset, e.g. 2022-11-06T01:00-04:00")
        if value.utcoffset() is None:
            raise ValidationError(f"{label} {value.isoformat()!r} needs a UTC offset (e.g. -04:00 or Z): "
                                  "a local hour such as 01:00 happens twice when clocks go back", field=field)
        if not _MIN_YEAR <= value.year <= _MAX_YEAR:
            raise _bad(field, value.isoformat(), f"a year between {_MIN_YEAR} and {_MAX_YEAR}")
        at = value.astimezone(UTC)
        # Partitions are UTC hours, so alignment is checked in UTC (Asia/Kolkata starts at :30 local).
        if at != at.replace(minute=0, second=0, microsecond=0):
            raise ValidationError(f"{label} {value.isoformat()!r} is not the start of an hourly partition; "
                                  "minutes and seconds must be zero in UTC", field=field)
        local = at.astimezone(zone)
        # An instant is an instant whatever its offset, but the form asks for the zone's
        # local hour: an offset that is neither the zone's at that hour nor UTC's is
        # more likely a slip (+05:00 for -05:00) than a wish to back-fill another day.
        if value.utcoffset() not in (local.utcoffset(), timedelta(0)):
            raise ValidationError(
                f"{label} {value.isoformat()!r} has UTC offset {_offset(value)}, but {zone.key} is at "
                f"{_offset(local)} then: that instant is {local.isoformat()} there. Give the local hour "
                f"with {zone.key}'s offset, or the UTC time with Z", field=field)
        return local

    expected = "YYYY-MM-DD" if grain == "day" else "YYYY-MM"
    if isinstance(value, datetime):
        # Accept a datetime only if it is exactly the partition start; naive means local wall time.
        naive = value.utcoffset() is None
        d = value.date() if naive else value.astimezone(zone).date()
        if naive and value.time() != datetime.min.time():
            raise _bad(field, value.isoformat(), f"a date ({expected}) or local midnight")
    elif isinstance(value, date):
        d, naive = value, True
    elif isinstance(value, str):
        pattern = _DAY_RE if grain == "day" else _MONTH_RE
        try:
            if not pattern.fullmatch(value):
                raise ValueError
            d = date.fromisoformat(value if len(value) == 10 else value + "-01")
        except ValueError:
            raise _bad(field, value, expected) from None
        naive = True
    else:
        raise _bad(field, value, expected)
    if not _MIN_YEAR <= d.year <= _MAX_YEAR:
        raise _bad(field, value, f"a year between {_MIN_YEAR} and {_MAX_YEAR}")
    if grain == "month" and d.day != 1:
        raise ValidationError(f"{label} {str(value)!r} is not the first day of a month; "
                              "monthly partitions are named YYYY-MM", field=field)
    start = _day_start(d, zone)
    if start.astimezone(zone).date() != d:  # e.g. Pacific/Apia skipped 2011-12-30 entirely
        raise ValidationError(f"{label} {str(value)!r} does not exist in {timezone}", field=field)
    if not naive and value != start:
        raise _bad(field, value.isoformat(), f"the local start of a {grain} in {timezone}")
    return start.astimezone(zone)


def plan_intervals(*, grain: str, timezone: str, first, last, limit: int | None = None) -> list[PlannedInterval]:
    """Every partition from first to last INCLUSIVE, as contiguous UTC intervals.

    The count is checked against `limit` before anything is built, so an absurd
    request is refused cheaply.
    """
    zone = _zone(timezone)
    s = parse_partition(grain=grain, timezone=timezone, value=first, field="start")
    e = parse_partition(grain=grain, timezone=timezone, value=last, field="end")
    if e.astimezone(UTC) < s.astimezone(UTC):
        raise ValidationError(f"last partition {_key(grain, e)!r} is before first partition {_key(grain, s)!r}",
                              field="end")
    if grain == "hour":
        count = (e.astimezone(UTC) - s.astimezone(UTC)) // _HOUR + 1
    elif grain == "day":
        count = (e.date() - s.date()).days + 1
    else:
        count = (e.year - s.year) * 12 + e.month - s.month + 1
    if limit is not None and count > limit:
        raise ValidationError(f"this range has {count} intervals; the limit is {limit}; split the request",
                              field="end")

    s_utc = s.astimezone(UTC)
    if grain == "hour":
        bounds = [s_utc + i * _HOUR for i in range(count + 1)]
    elif grain == "day":
        first_day = s.date()
        bounds = [_day_start(first_day + timedelta(days=i), zone) for i in range(count + 1)]
    else:
        bounds, d = [], s.date()
        for _ in range(count + 1):
            bounds.append(_day_start(d, zone))
            d = _next_month(d)
    return _build(grain, zone, bounds)


def partition_for(*, grain: str, timezone: str, at: datetime) -> PlannedInterval:
    """The partition containing an instant (e.g. "which day did this event land in")."""
    if at.utcoffset() is None:
        raise ValueError("partition_for needs an aware datetime")
    grain, zone = _grain(grain), _zone(timezone)
    if grain == "hour":
        start = at.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
        return _build(grain, zone, [start, start + _HOUR])[0]
    d = at.astimezone(zone).date()
    if grain == "day":
        return _build(grain, zone, [_day_start(d, zone), _day_start(d + timedelta(days=1), zone)])[0]
    d = d.replace(day=1)
    return _build(grain, zone, [_day_start(d, zone), _day_start(_next_month(d), zone)])[0]


def interval_for_key(*, grain: str, timezone: str, partition_key: str) -> PlannedInterval:
    """Inverse of PlannedInterval.partition_key; only canonical keys are accepted."""
    grain, _ = _grain(grain), _zone(timezone)
    shape = {"hour": r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(:\d{2})?[+-]\d{2}:\d{2}(:\d{2})?",
             "day": _DAY_RE.pattern, "month": r"\d{4}-\d{2}"}[grain]
    if not isinstance(partition_key, str) or not re.fullmatch(shape, partition_key):
        raise ValidationError(f"partition {partition_key!r} is not a valid {grain} partition key", field="partition")
    local = parse_partition(grain=grain, timezone=timezone, value=partition_key, field="partition")
    iv = partition_for(grain=grain, timezone=timezone, at=local)
    # A key whose offset is not the zone's offset at that instant, or a day that
    # does not exist locally, would otherwise map silently onto another partition.
    if iv.partition_key != partition_key:
        raise ValidationError(f"partition {partition_key!r} does not exist in {timezone} "
                              f"(that instant is partition {iv.partition_key!r})", field="partition")
    return iv


def previous_partition(*, grain: str, timezone: str, partition_key: str) -> str:
    """The partition just before, for depends_on_past jobs; intervals are contiguous, so it
    is the one containing the instant just before this one starts."""
    iv = interval_for_key(grain=grain, timezone=timezone, partition_key=partition_key)
    return partition_for(grain=grain, timezone=timezone, at=iv.start - timedelta(microseconds=1)).partition_key


def offset_matters(*, timezone: str, partition_key: str) -> bool:
    """Whether an hourly partition's local hour alone fails to name it: the clocks
    change at its start or end, so its wall time repeats (autumn) or the hour before or
    after it is skipped (spring). A label for such an hour must show its UTC offset."""
    start = datetime.fromisoformat(partition_key)
    zone = _zone(timezone)
    offset = start.astimezone(zone).utcoffset()
    return any((start + step).astimezone(zone).utcoffset() != offset for step in (-_HOUR, _HOUR))


def first_unended(intervals: Sequence[PlannedInterval], *, now: datetime) -> PlannedInterval | None:
    """The first of these intervals (in order, as planned) that has not ended at `now`,
    or None when every one has. An interval [start, end) has ended once `now` >= end."""
    i = bisect_right(intervals, now, key=lambda iv: iv.end)
    return intervals[i] if i < len(intervals) else None


def dst_notes(intervals) -> list[str]:
    """Plain-language warnings for a preview, so a 25-hour day is never a surprise."""
    return [f"{iv.partition_key}: {iv.note}" for iv in intervals if iv.note]
