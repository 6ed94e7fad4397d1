"""Load the demo: users and roles, the demo catalog, warehouse tables and source data.
Idempotent: a second run adds nothing."""
from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.contrib.auth.models import Group, User
from django.core.management.base import CommandError
from django.db import transaction

from backfill_portal.backends import get_warehouse
from backfill_portal.catalog.models import Dataset
from backfill_portal.catalog.services.sync import CatalogError, catalog_sync_file
from backfill_portal.catalog.specs import spec_for

# A day's source rows are made in memory before they are written: these bound one day
# (about 100 MB) and the whole load. `--orders-per-day 99999999999999999999` used 22 GB
# before the kernel killed it.
MAX_ORDERS_PER_DAY = 200_000
MAX_PAGE_VIEWS_PER_HOUR = 20_000
MAX_DEMO_ROWS = 50_000_000
from backfill_portal.core.management.base import PortalCommand
from backfill_portal.core.roles import Role

DEMO_USERS = {
    "alice": [Role.REQUESTER],
    "olivia": [Role.OWNER, Role.REQUESTER],
    "sam": [Role.OWNER, Role.REQUESTER],
    "rita": [Role.OWNER],
    "finn": [Role.OWNER],
    "oscar": [Role.ONCALL],
    "audrey": [Role.AUDITOR],
}
DEMO_CATALOG = Path(__file__).resolve().parents[2] / "demo" / "catalog.yaml"


def demo_logins_note() -> str:
    """The line `run_portal` prints about signing in as the demo users."""
    if settings.DEBUG or settings.DEMO_PASSWORDS:
        return ("demo logins (password = username + '-demo'): alice (requester), olivia, sam, rita, finn "
                "(owners), oscar (on-call), audrey (auditor), admin")
    return "demo users have no passwords (DEBUG is off): set them with `manage.py changepassword USER`"


def ensure_demo_users(*, with_passwords: bool = True) -> list[str]:
    """Create the demo users that are missing. With `with_passwords` they get the
    well-known `<name>-demo` passwords; without, no usable password (they still own the
    demo datasets, and nobody can sign in as them until an admin sets a password)."""
    created = []
    with transaction.atomic():
        for role in Role.values:
            Group.objects.get_or_create(name=role)
        for username, roles in DEMO_USERS.items():
            user, made = User.objects.get_or_create(username=username, defaults={"email": f"{username}@example.com"})
            if made:
                if with_passwords:
                    user.set_password(f"{username}-demo")
                else:
                    user.set_unusable_password()
                user.save()
                created.append(username)
            user.groups.add(*Group.objects.filter(name__in=roles))
        if not User.objects.filter(username="admin").exists():
            User.objects.create_superuser("admin", "admin@example.com", "admin-demo" if with_passwords else None)
            created.append("admin")
        User.objects.get(username="admin").groups.add(Group.objects.get(name=Role.ADMIN))
    return created


class Command(PortalCommand):
    help = "Load demo users, the demo catalog, warehouse tables and synthetic source data (idempotent)."

    def add_arguments(self, parser):
        parser.add_argument("--orders-per-day", type=int, default=None)
        parser.add_argument("--page-views-per-hour", type=int, default=None)
        parser.add_argument("--first", default="2022-09-01")
        parser.add_argument("--last", default="2022-12-31")
        parser.add_argument("--no-data", action="store_true", help="users and catalog only")
        parser.add_argument("--no-story", action="store_true",
                            help="source data only: no production history, no incident (web/demo/story.py)")
        parser.add_argument("--demo-passwords", action="store_true",
                            help="give new demo users their well-known passwords even when DEBUG is off "
                                 "(also DEMO_PASSWORDS=1); with DEBUG on they always get them")

    def _progress(self, line: str) -> None:
        self.stdout.write(line)
        self.stdout.flush()

    def handle(self, *args, orders_per_day, page_views_per_hour, first, last, no_data, no_story, demo_passwords, **options):
        from datetime import date

        from backfill_portal.web.demo.sources import days_missing, feed_demo_sources, load_demo_sources
        from backfill_portal.web.demo.story import HISTORY_FIRST, HISTORY_LAST, story_told, tell_story

        # The arguments before anything is written (users and catalog came first before).
        try:
            days = {"first": date.fromisoformat(first), "last": date.fromisoformat(last)}
        except ValueError as exc:
            raise CommandError(f"--first/--last: {exc}") from None
        if days["last"] < days["first"]:
            raise CommandError(f"--last {last} is before --first {first}")
        if days["first"].year < 1900 or days["last"].year > 9998:
            raise CommandError(f"--first/--last: the demo's days are from 1900 to 9998, not {first}..{last}")
        if (days["last"] - days["first"]).days > 3660:
            raise CommandError("--first/--last: at most ten years of demo data")
        for name, value, most in (("--orders-per-day", orders_per_day, MAX_ORDERS_PER_DAY),
                                  ("--page-views-per-hour", page_views_per_hour, MAX_PAGE_VIEWS_PER_HOUR)):
            if value is not None and not 1 <= value <= most:
                raise CommandError(f"{name} must be from 1 to {most:,}, not {value}")
        rows = ((days["last"] - days["first"]).days + 1) * ((orders_per_day or 8000) * 3
                                                            + 24 * (page_views_per_hour or 400))
        if rows > MAX_DEMO_ROWS:
            raise CommandError(f"--first/--last with these rates make about {rows:,} source rows; the demo makes at "
                               f"most {MAX_DEMO_ROWS:,} (fewer days, or lower rates)")
        warehouse = get_warehouse()  # reach both databases before writing to either
        # Well-known passwords on a production deployment would be open doors.
        with_passwords = settings.DEBUG or demo_passwords or settings.DEMO_PASSWORDS
        created = ensure_demo_users(with_passwords=with_passwords)
        self.stdout.write(f"users: {len(created)} created" + (f" ({', '.join(created)})" if created else ""))
        if created and not with_passwords:
            self.stdout.write("users: created without passwords because DEBUG is off (the well-known demo "
                              "passwords only with --demo-passwords or DEMO_PASSWORDS=1); set real ones with "
                              "`manage.py changepassword USER`")
        try:
            report = catalog_sync_file(path=DEMO_CATALOG, actor=User.objects.get(username="admin"),
                                       reason="load_demo: the demo catalog")
        except CatalogError as exc:
            raise CommandError(f"demo catalog: {exc.message}") from None
        for line in report.lines()[-1:]:
            self.stdout.write(f"catalog: {line}")
        for dataset in Dataset.objects.filter(is_source=False):
            warehouse.ensure_dataset(spec_for(dataset))
        if no_data:
            return
        kwargs = days
        scale = {}
        if orders_per_day:
            scale["orders_per_day"] = orders_per_day
        if page_views_per_hour:
            scale["page_views_per_hour"] = page_views_per_hour
        counts = load_demo_sources(warehouse, progress=self._progress, **kwargs, **scale)
        self.stdout.write("source data: " + ", ".join(f"{k} +{v}" for k, v in counts.items()))
        fed = feed_demo_sources(warehouse, **scale)
        if any(fed.values()):
            self.stdout.write("live feed: the source days around today: " + ", ".join(
                f"{k} +{v}" for k, v in fed.items()))
        if no_story:
            return
        missing = days_missing(warehouse, first=HISTORY_FIRST, last=HISTORY_LAST)
        if missing:
            self.stdout.write(f"story: not told: the source data lacks {missing} day(s) of {HISTORY_FIRST} .. "
                              f"{HISTORY_LAST} (load them with --first/--last)")
            return
        if story_told():
            self.stdout.write("story: told on an earlier start (the production history and the 2 a.m. incident)")
            return
        self._progress("story: publishing the production history Sep - Nov 2022 through the portal, "
                       "then the 2 a.m. incident ...")
        tell_story(progress=self._progress)
