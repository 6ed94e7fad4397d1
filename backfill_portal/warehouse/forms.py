"""Web forms for the warehouse pages: shape only; the rollback service decides."""
from __future__ import annotations

from django import forms


class RollbackForm(forms.Form):
    reason = forms.CharField(label="Reason", max_length=4000, required=False,
                             widget=forms.Textarea(attrs={"rows": 2}),
                             help_text="Required. Readers and auditors will ask why the numbers moved back.")
    rebuild = forms.BooleanField(label="Also file requests to rebuild the consumers", required=False,
                                 help_text="One request per consumer job over the partitions it built from the "
                                           "rolled-back version, sent for approval.")
