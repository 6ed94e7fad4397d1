"""Convert a warehouse from the view layout to real reader tables (issue #15).

Before, `<dataset>` was a view joining `<dataset>__versions` (every version of every
partition) to the pointer table; now it is a real table holding exactly the published
rows (docs/architecture.md, "Isolated versions"). A process running the new code
refuses a dataset still in the old layout with a one-line error naming this command.
Each dataset converts in one warehouse transaction: every committed version, every
marker, pointer and pointer move is kept. Running it again does nothing.

On PostgreSQL it also converts a dataset between the two reader layouts
(backends.READER_LAYOUTS) when the catalog, or the warehouse URL's default, names
another one than its reader table has (an hourly dataset gets a table).
"""
from __future__ import annotations

from django.core.management.base import CommandError
from django.db import transaction

from backfill_portal.backends import get_warehouse
from backfill_portal.catalog.models import Dataset
from backfill_portal.catalog.specs import spec_for
from backfill_portal.core.management.base import PortalCommand
from backfill_portal.core.services.audit import audit_record


class Command(PortalCommand):
    help = ("Convert the warehouse's produced datasets from the view layout (<dataset> a view over "
            "<dataset>__versions) to reader tables, and on PostgreSQL between the reader layouts the catalog "
            "names (partitioned, table), keeping every version and the publication history. Idempotent.")

    def add_arguments(self, parser):
        parser.add_argument("--dataset", action="append", default=[], metavar="NAME",
                            help="convert only this dataset (repeatable); default: every produced dataset")
        parser.add_argument("--reason", default="warehouse layout upgrade (issue #15)",
                            help="recorded with each conversion in the audit log")

    def handle(self, *args, **options):
        datasets = Dataset.objects.filter(is_source=False).order_by("name")
        if options["dataset"]:
            wanted = set(options["dataset"])
            if not all(name.strip() for name in wanted):
                raise CommandError("--dataset needs a dataset's name")
            unknown = sorted(wanted - set(datasets.filter(name__in=wanted).values_list("name", flat=True)))
            if unknown:
                raise CommandError(f"no produced dataset named {', '.join(map(repr, unknown))} in the catalog")
            datasets = datasets.filter(name__in=wanted)
        warehouse = get_warehouse()
        converted = 0
        for dataset in datasets:
            done = warehouse.upgrade_layout(spec_for(dataset))
            if not done:
                self.stdout.write(f"{dataset.name}: nothing to convert")
                continue
            converted += 1
            with transaction.atomic():
                audit_record(actor=None, action="warehouse.upgrade_layout", object_type="dataset",
                             object_id=dataset.pk, dataset=dataset.name, reason=options["reason"], data=done)
            details = ", ".join(f"{key.replace('_', ' ')} {value}" for key, value in done.items())
            self.stdout.write(f"{dataset.name}: converted ({details})")
        self.stdout.write(f"{converted} dataset(s) converted")
