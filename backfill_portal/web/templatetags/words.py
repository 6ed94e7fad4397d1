"""State names in words, for people: ``pending_approval`` -> ``pending approval``.

The stored values stay what the API, the audit log and the CSS classes use; a page
shows the words (the Choices' own labels, lower-cased: Django derives a TextChoices
label from its value the same way).

    {% load words %}{{ req.status|state_label }}
"""
from __future__ import annotations

from django import template

register = template.Library()


@register.filter
def state_label(value) -> str:
    if value is None or value == "":
        return ""
    return str(value).replace("_", " ")


def run_state_words(status: str, run_type: str) -> str:
    """A run's state as people read it. A second-rerun verification run ends `cancelled`
    (it is never published: it only proves the original), which an auditor read as
    someone having cancelled it; it reads "retired (verification)"."""
    if run_type == "verification" and status == "cancelled":
        return "retired (verification)"
    return state_label(status)


@register.filter
def run_state(run) -> str:
    """`{{ run|run_state }}`: run_state_words of a Run (or a dict with status and run_type)."""
    get = run.get if isinstance(run, dict) else lambda name: getattr(run, name, "")
    return run_state_words(get("status") or "", get("run_type") or "")
