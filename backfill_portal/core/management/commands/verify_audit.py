from django.core.management.base import CommandError

from backfill_portal.core.management.base import PortalCommand
from backfill_portal.core.services.audit import audit_check


class Command(PortalCommand):
    help = ("Walk the audit log's keyed chain, hold it against the newest anchor (AUDIT_ANCHOR_PATH) "
            "and name the first broken link or missing id.")

    def handle(self, *args, **options):
        check = audit_check()
        if not check.intact:
            raise CommandError(check.problem)
        legacy = f", {check.legacy} of them unkeyed from before AUDIT_KEY" if check.legacy else ""
        if check.anchor is None:
            against = "; no anchor yet to hold it against (run manage.py anchor_audit)"
        else:
            against = (f"; matches its anchor of {check.anchor.when} "
                       f"({check.anchor.count} event(s) up to #{check.anchor.last_id})")
            if check.unanchored:
                after = f" after #{check.anchor.last_id}" if check.anchor.last_id is not None else ""
                against += (f"; {check.unanchored} event(s){after} are not anchored yet: their deletion could not "
                            "be detected until the next anchor (manage.py anchor_audit)")
        self.stdout.write(f"audit log intact: {check.checked} event(s) verified{legacy}{against}")
