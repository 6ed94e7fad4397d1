"""Durations for people: milliseconds under a second, seconds under a minute, then minutes and seconds, then hours.

    {% load timing %}{{ attempt.started_at|duration:attempt.finished_at }}  {{ 42.5|seconds }}
"""
from __future__ import annotations

from datetime import datetime

from django import template

register = template.Library()


def words(total: float) -> str:
    if total < 0:
        return "—"
    if total < 1:
        return f"{round(total * 1000)} ms"
    if total < 10:
        return f"{total:.1f} s"
    if total < 60:
        return f"{round(total)} s"
    minutes, secs = divmod(round(total), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s" if secs else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"


@register.filter
def duration(start: datetime | None, end: datetime | None) -> str:
    """From start to end; "—" when either is missing."""
    if start is None or end is None:
        return "—"
    return words((end - start).total_seconds())


@register.filter
def seconds(value) -> str:
    if value is None or value == "":
        return "—"
    return words(float(value))
