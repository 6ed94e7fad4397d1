"""Web forms for backfill requests. Shape and type checks only: the service
(backfill_request_create) decides meaning, and its field errors are put back on
these fields by the view."""
from __future__ import annotations

import uuid
from datetime import datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django import forms

from backfill_portal.backfills.choices import Cascade, Strategy
from backfill_portal.backfills.models import MAX_ACTIVE_INTERVALS_LIMIT
from backfill_portal.catalog.models import Job
from backfill_portal.core.text import no_control_characters


def partition_format(grain: str, timezone: str) -> dict[str, str]:
    """What a first/last partition looks like for a grain, with an example in its zone."""
    if grain == "hour":
        try:
            now = datetime.now(ZoneInfo(timezone)).replace(minute=0, second=0, microsecond=0)
            example = now.isoformat(timespec="minutes")
        except (ZoneInfoNotFoundError, ValueError):
            example = "2022-11-06T01:00-04:00"
        return {"pattern": "YYYY-MM-DDTHH:00±HH:MM", "example": example,
                "text": f"a local hour in {timezone} with its UTC offset, e.g. {example}, or the same "
                        "instant in UTC with Z; the offset tells a repeated autumn hour apart"}
    if grain == "month":
        return {"pattern": "YYYY-MM", "example": "2022-10", "text": f"a month in {timezone}, e.g. 2022-10"}
    return {"pattern": "YYYY-MM-DD", "example": "2022-10-01",
            "text": f"a local day in {timezone}, e.g. 2022-10-01 (cut at local midnight)"}


class StaleExclusionField(forms.Field):
    """The preview's "leave out" checkboxes for stale later partitions, each `job|partition`,
    as {job: [partition]}. Shape only: the service refuses a partition that is not stale."""

    widget = forms.MultipleHiddenInput

    def to_python(self, value) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for item in value or []:
            job, sep, key = str(item).partition("|")
            if not sep or not job.strip() or not key.strip():
                raise forms.ValidationError(f"{item!r} is not a job|partition pair")
            out.setdefault(job.strip(), []).append(key.strip())
        return out


class RequestForm(forms.Form):
    job = forms.ChoiceField(label="Job")
    start = forms.CharField(label="First partition", max_length=64)
    end = forms.CharField(label="Last partition", max_length=64,
                          help_text="inclusive")
    reason = forms.CharField(label="Reason", max_length=4000, validators=[no_control_characters],
                             widget=forms.Textarea(attrs={"rows": 3}),
                             help_text="Why this backfill is needed. Auditors will read it.")
    cascade = forms.ChoiceField(label="Cascade", choices=Cascade.choices, initial=Cascade.NONE)
    strategy = forms.ChoiceField(label="Order", choices=Strategy.choices, initial=Strategy.FORWARD)
    max_active_intervals = forms.IntegerField(label="Max active intervals", min_value=1,
                                              max_value=MAX_ACTIVE_INTERVALS_LIMIT, initial=4)
    side_effects = forms.MultipleChoiceField(
        label="Authorise side-effect nodes", required=False, widget=forms.CheckboxSelectMultiple,
        help_text="Side-effect nodes are skipped in a backfill unless authorised here; each one adds "
                  "an approval step for its owner.",
    )
    verify_twice = forms.BooleanField(label="Second-rerun verification", required=False,
                                      help_text="Compute each interval again in isolation and prove "
                                                "the four numbers do not move.")
    confirm_overlap = forms.BooleanField(label="Submit although it overlaps an active request", required=False)
    exclude_stale = StaleExclusionField(label="Leave out stale later partitions", required=False)
    # Not a user field: makes a double click, or a resubmission after an overlap warning,
    # reuse the draft already created instead of filing a second one.
    idempotency_key = forms.CharField(widget=forms.HiddenInput, required=False, max_length=128)
    # Which button was pressed. Absent (Enter in a field of an old page) saves a draft;
    # any other value is refused instead of silently saving one.
    action = forms.ChoiceField(
        required=False, choices=[("create", "Save draft"), ("submit", "Create and submit")],
        error_messages={"invalid_choice": "Unknown action %(value)s: press “Save draft” or “Create and submit”."})

    def __init__(self, *args, jobs=None, **kwargs):
        super().__init__(*args, **kwargs)
        if jobs is None:
            jobs = list(Job.objects.select_related("dataset__owner").filter(dataset__is_source=False).order_by("name"))
        self.jobs = {job.name: job for job in jobs}
        targets = [(j.name, self._label(j)) for j in jobs if not j.has_side_effects]
        effects = [(j.name, self._label(j)) for j in jobs if j.has_side_effects]
        choices = [("", "— choose a job —"), ("Jobs", targets)]
        if effects:
            choices.append(("Side-effect nodes", effects))
        self.fields["job"].choices = choices
        self.fields["side_effects"].choices = [(j.name, f"{j.name} (owner: {j.dataset.owner.username})")
                                               for j in jobs if j.has_side_effects]
        if not self.is_bound and not self.initial.get("idempotency_key"):
            self.initial["idempotency_key"] = uuid.uuid4().hex
        self.show_confirm_overlap = False
        self._set_partition_help()

    @staticmethod
    def _label(job: Job) -> str:
        ds = job.dataset
        return f"{job.name} — {ds.get_grain_display().lower()}, {ds.timezone}"

    def selected_job(self) -> Job | None:
        name = self.data.get("job") if self.is_bound else self.initial.get("job")
        return self.jobs.get(name or "")

    def _set_partition_help(self) -> None:
        job = self.selected_job()
        if job is None:
            self.fields["start"].help_text = "Choose a job to see the partition format."
            self.fields["end"].help_text = "Inclusive."
            return
        fmt = partition_format(job.dataset.grain, job.dataset.timezone)
        self.fields["start"].help_text = f"{fmt['pattern']}: {fmt['text']}."
        self.fields["end"].help_text = f"Inclusive; same format ({fmt['pattern']}, {job.dataset.timezone})."
        for name in ("start", "end"):
            self.fields[name].widget.attrs["placeholder"] = fmt["example"]

    def service_kwargs(self) -> dict:
        data = self.cleaned_data
        return {
            "job": data["job"], "start": data["start"].strip(), "end": data["end"].strip(), "reason": data["reason"],
            "cascade": data["cascade"], "strategy": data["strategy"],
            "max_active_intervals": data["max_active_intervals"], "side_effects": list(data["side_effects"]),
            "verify_twice": bool(data["verify_twice"]), "idempotency_key": data.get("idempotency_key") or None,
            "exclude_stale": data.get("exclude_stale") or {},
        }


class DecisionForm(forms.Form):
    comment = forms.CharField(label="Comment", required=False, max_length=4000, validators=[no_control_characters],
                              widget=forms.Textarea(attrs={"rows": 2}),
                              help_text="Required when rejecting: say what the requester should fix.")


class HandoffDecisionForm(forms.Form):
    comment = forms.CharField(label="Comment", required=False, max_length=4000, validators=[no_control_characters],
                              widget=forms.Textarea(attrs={"rows": 2}),
                              help_text="Required when declining: say why the downstream stays on its current version.")


class ExplainForm(forms.Form):
    explanation = forms.CharField(label="Explanation", required=False, max_length=4000,
                                  validators=[no_control_characters],
                                  widget=forms.Textarea(attrs={"rows": 2}),
                                  help_text="Why this interval's numbers differ (for example: late events from the "
                                            "gateway, now included).")
    job = forms.CharField(required=False, max_length=128, widget=forms.HiddenInput)


class SignoffForm(forms.Form):
    comment = forms.CharField(label="Sign-off comment", required=False, max_length=4000,
                              validators=[no_control_characters],
                              widget=forms.Textarea(attrs={"rows": 2}))


class RequestRollbackForm(forms.Form):
    reason = forms.CharField(label="Why roll back", required=False, max_length=4000, validators=[no_control_characters],
                             widget=forms.Textarea(attrs={"rows": 2}),
                             help_text="Required. Every partition this request published goes back to its previous "
                                       "verified version, or none does.")
    rebuild = forms.BooleanField(label="Also file one request to rebuild the consumers and everything built from them",
                                 required=False, initial=True)


class ReasonForm(forms.Form):
    # Not required here: the service refuses a blank reason with the same field error
    # for the page and the API.
    reason = forms.CharField(label="Reason", required=False, max_length=4000, validators=[no_control_characters],
                             help_text="Required: the requester and auditors will read why it was cancelled.")


class SubmitForm(forms.Form):
    confirm_overlap = forms.BooleanField(required=False)
