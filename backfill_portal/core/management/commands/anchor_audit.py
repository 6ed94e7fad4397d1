from django.core.management.base import CommandError

from backfill_portal.core.management.base import PortalCommand
from backfill_portal.core.services.audit import AuditChainBroken, audit_anchor


class Command(PortalCommand):
    help = ("Append the audit chain's head (first and last id, hash, count, time) to the anchor file "
            "(AUDIT_ANCHOR_PATH) after verifying what was written since the last anchor. The scheduler "
            "runs it every AUDIT_ANCHOR_SECONDS.")

    def handle(self, *args, **options):
        try:
            anchor, appended = audit_anchor(actor=None)
        except AuditChainBroken as exc:
            raise CommandError(f"not anchored: {exc}") from None
        head = f"{anchor.count} event(s) up to #{anchor.last_id}" if anchor.count else "an empty log"
        if appended:
            self.stdout.write(f"audit anchored: {head} at {anchor.when}")
        else:
            self.stdout.write(f"audit anchor unchanged: {head} since {anchor.when}")
