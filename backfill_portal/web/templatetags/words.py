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
