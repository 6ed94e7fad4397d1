from django.apps import AppConfig


class WebConfig(AppConfig):
    """The HTTP layer (no models): pages, API views and serializers, forms, template
    filters, the demo. It sits on top of every domain app and nothing imports it."""

    name = "backfill_portal.web"
    label = "web"

    def ready(self) -> None:
        from django.contrib import admin

        from backfill_portal.web.forms.auth import AdminSignInForm

        admin.site.login_form = AdminSignInForm  # the admin's sign-in checks lengths as the portal's does
