"""Widgets of the filter forms that are rendered on every load of a long list.

Django renders a <select> through templates, one include per <option> (and one more
for its attributes): ~0.1 ms an option, so the runs list's four filters (~60 options)
cost more than the page's SQL. `QuickSelect` builds the same markup in Python from the
same context (`Select.get_context`: the options, which are selected, the attributes).
"""
from __future__ import annotations

from django import forms
from django.forms.utils import flatatt
from django.utils.html import conditional_escape, format_html
from django.utils.safestring import mark_safe


class QuickSelect(forms.Select):
    """forms.Select, rendered without its templates (no optgroups in our filters)."""

    def render(self, name, value, attrs=None, renderer=None):
        widget = self.get_context(name, value, attrs)["widget"]
        options = []
        for group_name, group_choices, _index in widget["optgroups"]:
            if group_name:  # not used by our filters: Django's own rendering keeps it right
                return super().render(name, value, attrs, renderer)
            for option in group_choices:
                options.append(format_html('<option value="{}"{}>{}</option>',
                                           str(option["value"]), flatatt(option["attrs"]), option["label"]))
        return mark_safe(f'<select name="{conditional_escape(widget["name"])}"{flatatt(widget["attrs"])}>'
                         + "".join(options) + "</select>")
