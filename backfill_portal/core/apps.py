from django.apps import AppConfig


class CoreConfig(AppConfig):
    name = "backfill_portal.core"
    label = "core"

    def ready(self):
        from django.contrib.auth.signals import user_login_failed

        from backfill_portal.core import role_audit
        from backfill_portal.core.authentication import on_login_failed

        # Every sign-in path sends it (the login page, the admin's, the token endpoint).
        user_login_failed.connect(on_login_failed, dispatch_uid="backfill_portal.core.audit_login_failed")
        # Roles change where no service runs (the admin, the ORM): see core/role_audit.py.
        role_audit.connect()
