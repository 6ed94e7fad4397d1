"""QuickSelect renders what Django's Select renders (the same elements, attributes and
escaping; whitespace and attribute order aside), and the runs list's filters use it."""
from __future__ import annotations

import pytest
from django import forms
from django.test.html import parse_html

from backfill_portal.web.forms.runs import RunFilterForm
from backfill_portal.web.forms.widgets import QuickSelect

CHOICES = [("", "any"), ("a<b", 'x"y'), ("c", "c & d"), (3, "three")]


@pytest.mark.parametrize("value", ["", "c", None, "zz", 3, "3"])
def test_quick_select_is_djangos_select(value):
    attrs = {"id": "id_state", "aria-describedby": "id_state_helptext", "required": True, "disabled": False}
    django_html = forms.Select(choices=CHOICES).render("state", value, dict(attrs))
    quick_html = QuickSelect(choices=CHOICES).render("state", value, dict(attrs))
    assert parse_html(quick_html) == parse_html(django_html)
    assert "<b" not in quick_html


def test_quick_select_with_groups_falls_back_to_django():
    grouped = [("g", [("a", "A")]), ("b", "B")]
    assert parse_html(QuickSelect(choices=grouped).render("x", "a")) == parse_html(
        forms.Select(choices=grouped).render("x", "a"))


def test_the_runs_filters_render_with_it():
    form = RunFilterForm({"state": "failing", "job": "j<1>"}, jobs=["j<1>"], datasets=["d"])
    assert form.is_valid()
    html = str(form["job"])
    assert parse_html(html) == parse_html(
        '<select name="job" id="id_job"><option value="">any job</option>'
        '<option value="j&lt;1&gt;" selected>j&lt;1&gt;</option></select>')
    assert isinstance(form.fields["state"].widget, QuickSelect)
