"""The audit log page's filters."""
from __future__ import annotations

from django import forms


class AuditFilterForm(forms.Form):
    request = forms.IntegerField(label="Request #", required=False, min_value=1)
    actor = forms.CharField(label="Actor", required=False, max_length=150)
    action = forms.CharField(label="Action starts with", required=False, max_length=64,
                             widget=forms.TextInput(attrs={"placeholder": "request."}))
    dataset = forms.CharField(label="Dataset", required=False, max_length=128)
    since = forms.DateTimeField(label="Since (UTC)", required=False,
                                widget=forms.DateTimeInput(attrs={"type": "datetime-local"}))
    until = forms.DateTimeField(label="Until (UTC, exclusive)", required=False,
                                widget=forms.DateTimeInput(attrs={"type": "datetime-local"}))

    def filter(self, qs):
        """Same filters as the API's AuditFilter (action is a prefix match)."""
        if not self.is_valid():
            return qs.none()
        data = self.cleaned_data
        if data["request"]:
            qs = qs.filter(request_id=data["request"])
        if data["actor"]:
            qs = qs.filter(actor_name=data["actor"].strip())
        if data["action"]:
            qs = qs.filter(action__startswith=data["action"].strip())
        if data["dataset"]:
            qs = qs.filter(dataset=data["dataset"].strip())
        if data["since"]:
            qs = qs.filter(at__gte=data["since"])
        if data["until"]:
            qs = qs.filter(at__lt=data["until"])
        return qs
