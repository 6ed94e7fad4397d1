from django.core.management.base import CommandError

from backfill_portal.catalog.services.sync import CatalogError, catalog_parse, catalog_sync_file, catalog_validate
from backfill_portal.core.management.base import PortalCommand, actor_and_reason, add_actor_arguments, \
    describe_failure


class Command(PortalCommand):
    help = ("Sync a YAML catalog file into the database (idempotent); prints what it created, changed, left. "
            "Every change is audited with --actor and --reason: who synced and why.")

    def add_arguments(self, parser):
        parser.add_argument("path")
        add_actor_arguments(parser, does="syncs")

    def handle(self, *args, path, actor, reason, **options):
        try:
            # The file first: a broken file is reported as such whoever syncs it.
            catalog_validate(catalog_parse(_read(path)))
        except CatalogError as exc:
            line = describe_failure(exc)
            raise CommandError(line if str(path) in line else f"{path}: {line}") from None
        user, reason = actor_and_reason(actor, reason, does="syncs", changes="the catalog changes")
        try:
            report = catalog_sync_file(path=path, actor=user, reason=reason)
        except CatalogError as exc:
            line = describe_failure(exc)
            raise CommandError(line if str(path) in line else f"{path}: {line}") from None
        for line in report.lines():
            self.stdout.write(line)


def _read(path: str) -> str:
    from pathlib import Path

    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise CatalogError(f"cannot read the catalog file {path}: {exc.strerror}", field="path") from None
    except UnicodeDecodeError as exc:
        raise CatalogError(f"cannot read the catalog file {path}: it is not UTF-8 text (byte {exc.start})",
                           field="path") from None
