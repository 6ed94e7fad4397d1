"""The sign-in forms: the portal's page and the admin's."""
from __future__ import annotations

from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm
from django.core.validators import MaxLengthValidator

# As the API's token form (web/api/audit_and_tokens.py): a password longer than this is
# not one anybody set, and hashing it would only cost the server.
PASSWORD_MAX_LENGTH = 4096


class _Lengths:
    """Django's sign-in form, with the lengths enforced before anything is looked up.
    Django sets the username's max_length after the field is built, so no validator
    checks it: a 256-character username reached django-axes, whose failed-attempt row
    holds 255, and signing in was a 500 on PostgreSQL."""

    def __init__(self, request=None, *args, **kwargs):
        super().__init__(request, *args, **kwargs)
        self.fields["username"].validators.append(MaxLengthValidator(self.fields["username"].max_length))
        self.fields["password"].validators.append(MaxLengthValidator(PASSWORD_MAX_LENGTH))


class SignInForm(_Lengths, AuthenticationForm):
    pass


class AdminSignInForm(_Lengths, AdminAuthenticationForm):
    pass
