"""The runs list's filters: shape and type only; execution.selectors.run_rows filters."""
from __future__ import annotations

from datetime import date, datetime, time, timedelta, timezone

from django import forms

from backfill_portal.execution.choices import RunStatus, RunType
from backfill_portal.execution.selectors import RunFilters
from backfill_portal.web.forms.widgets import QuickSelect

STATE_CHOICES = [("", "any state"), ("failing", "failing (not fixed since)"), ("stuck", "stuck (no sign of life)"),
                 *((s.value, s.value.replace("_", " ")) for s in RunStatus)]


class RunFilterForm(forms.Form):
    state = forms.ChoiceField(label="State", choices=STATE_CHOICES, required=False, widget=QuickSelect)
    job = forms.ChoiceField(label="Job", required=False, widget=QuickSelect)
    dataset = forms.ChoiceField(label="Dataset", required=False, widget=QuickSelect)
    run_type = forms.ChoiceField(label="Run type", required=False, widget=QuickSelect,
                                 choices=[("", "any type"), *((t.value, t.value) for t in RunType)])
    since = forms.DateField(label="Created from (UTC)", required=False,
                            widget=forms.DateInput(attrs={"type": "date"}))
    until = forms.DateField(label="Created to (UTC, inclusive)", required=False,
                            widget=forms.DateInput(attrs={"type": "date"}))
    request = forms.IntegerField(label="Request", required=False, min_value=1, max_value=2**63 - 1,
                                 widget=forms.HiddenInput)

    def __init__(self, *args, jobs: list[str], datasets: list[str], **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["job"].choices = [("", "any job"), *((n, n) for n in jobs)]
        self.fields["dataset"].choices = [("", "any dataset"), *((n, n) for n in datasets)]

    def clean(self):
        data = super().clean()
        since, until = data.get("since"), data.get("until")
        if since and until and until < since:
            self.add_error("until", "the last day is before the first one")
        return data

    def filters(self) -> RunFilters:
        data = self.cleaned_data
        since, until = data.get("since"), data.get("until")
        return RunFilters(
            state=data.get("state") or "", job=data.get("job") or "", dataset=data.get("dataset") or "",
            run_type=data.get("run_type") or "", request=data.get("request"),
            since=datetime.combine(since, time(), tzinfo=timezone.utc) if since else None,
            # The day after `until`, exclusive; the last day a date holds has none (no bound).
            until=(datetime.combine(until + timedelta(days=1), time(), tzinfo=timezone.utc)
                   if until and until < date.max else None),
        )
