"""Web forms: shape only; the services decide."""

from collections.abc import Callable

from backfill_portal.core.errors import ValidationError


def cleaned(form, *, permission: Callable[[], None] | None = None) -> dict:
    """The form's cleaned data. When the form is invalid, `permission` (the action's
    policy check, which records a refusal in the audit log and raises) runs first, then
    the form's errors are raised, naming their fields: never the rest of the data with
    the bad field silently left out (an over-long comment used to be dropped and the
    approval or sign-off went through without it)."""
    if form.is_valid():
        return form.cleaned_data
    if permission is not None:
        permission()
    fields = {name: [str(m) for m in errors] for name, errors in form.errors.items()}
    name, messages = next(iter(fields.items()))
    label = form.fields[name].label if name in form.fields and form.fields[name].label else name
    raise ValidationError(f"{label}: {messages[0]}", fields=fields)
