from django.contrib.auth import get_user_model
from django.core.management.base import CommandError

from backfill_portal.backfills.code_staleness import stale_backfill_draft, stale_partitions
from backfill_portal.catalog import dbt_project
from backfill_portal.catalog.models import Job
from backfill_portal.catalog.services.dbt_sync import DbtSyncError, dbt_sync
from backfill_portal.core.errors import ApplicationError
from backfill_portal.core.management.base import PortalCommand, actor_and_reason, add_actor_arguments, \
    describe_failure


class Command(PortalCommand):
    help = ("Sync a dbt project (its directory, or its target/manifest.json) into the catalog (idempotent); "
            "prints what it created, changed, left, and the partitions built by older code versions. "
            "Every change is audited with --actor and --reason: who synced and why.")

    def add_arguments(self, parser):
        parser.add_argument("path", help="a dbt project directory, or its target/manifest.json")
        add_actor_arguments(parser, does="syncs")
        parser.add_argument("--draft-backfill", metavar="USERNAME", default="",
                            help="also file a draft request, as USERNAME, rebuilding the stale partitions")

    def handle(self, *args, path, actor, reason, draft_backfill, **options):
        # Who and why before dbt parses the project (seconds): the refusal comes at once.
        user, reason = actor_and_reason(actor, reason, does="syncs", changes="the catalog changes")
        drafter = None
        if draft_backfill:  # checked before anything is synced, whether or not anything turns out stale
            drafter = get_user_model().objects.filter(username=draft_backfill).first()
            if drafter is None:
                raise CommandError(f"--draft-backfill: {draft_backfill!r} is not a user")
        try:
            report = dbt_sync(path=path, actor=user, reason=reason)
        except DbtSyncError as exc:
            line = describe_failure(exc)
            raise CommandError(line if str(path) in line else f"{path}: {line}") from None
        for line in report.lines():
            self.stdout.write(line)
        if not dbt_project.warehouse_has_dbt_adapter():
            self.stdout.write(f"note: {dbt_project.NO_ADAPTER}")
        stale = {}
        for job in Job.objects.filter(name__in=report.new_code_versions).select_related("current_code_version"):
            partitions = stale_partitions(job=job)
            if partitions:
                stale[job.name] = partitions
                keys = ", ".join(p.partition_key for p in partitions)
                self.stdout.write(f"stale {job.name}: {len(partitions)} published partition(s) built by older code "
                                  f"(now {job.current_code_version.short_hash}): {keys}")
        if stale and not draft_backfill:
            self.stdout.write("file their rebuild with --draft-backfill USERNAME, or from each job's stale page")
        if stale and drafter is not None:
            try:
                request = stale_backfill_draft(actor=drafter, job_names=sorted(stale))
            except ApplicationError as exc:
                raise CommandError(f"--draft-backfill: {describe_failure(exc)}") from None
            self.stdout.write(f"draft request {request.pk} rebuilds them: submit it at /requests/{request.pk}/")
