"""Web forms for the warehouse pages: shape only; the rollback service decides."""
from __future__ import annotations

from django import forms

from backfill_portal.core.text import no_control_characters


class RollbackForm(forms.Form):
    reason = forms.CharField(label="Reason", max_length=4000, validators=[no_control_characters], required=False,
                             widget=forms.Textarea(attrs={"rows": 2}),
                             help_text="Required. Readers and auditors will ask why the numbers moved back.")
    rebuild = forms.BooleanField(label="Also file one request to rebuild the consumers and everything built from them",
                                 required=False,
                                 help_text="One request rebuilding every published partition built from the "
                                           "rolled-back version, in layer order, sent for approval.")
