from django.core.management.base import BaseCommand, CommandError

from backfill_portal.core.services.audit import audit_verify


class Command(BaseCommand):
    help = "Walk the audit log's hash chain and name the first broken link."

    def handle(self, *args, **options):
        checked, broken = audit_verify()
        if broken is not None:
            raise CommandError(
                f"audit chain broken at event #{broken.pk} ({broken.action} by {broken.actor_name} at {broken.at:%Y-%m-%d %H:%M:%S}); "
                f"{checked} event(s) before it verify"
            )
        self.stdout.write(f"audit log intact: {checked} event(s) verified")
