"""Issue an API token for a user from the shell (for automation accounts that have no
password to trade at POST /api/auth/token/). The key is printed once."""
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import CommandError

from backfill_portal.core.errors import ApplicationError
from backfill_portal.core.management.base import PortalCommand
from backfill_portal.core.services.tokens import api_token_issue

# How the audit log names whoever ran this: the shell has no portal user.
COMMAND_ACTOR = "manage.py issue_token"


class Command(PortalCommand):
    help = "Issue an API token for USER that expires after --days days; prints the key (shown only once)."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--days", type=int, default=None,
                            help=f"days until it expires (default {settings.API_TOKEN_DAYS}, "
                                 f"at most {settings.API_TOKEN_MAX_DAYS})")
        parser.add_argument("--label", default="", help="what the token is for")

    def handle(self, *args, username, days, label, **options):
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"no user named {username!r}")
        try:
            token, key = api_token_issue(actor=COMMAND_ACTOR, user=user, days=days, label=label, via="command")
        except ApplicationError as exc:
            raise CommandError(exc.message) from None
        self.stderr.write(f"token #{token.pk} for {user.username}, expires {token.expires_at:%Y-%m-%d %H:%M} UTC "
                          f"(send it as 'Authorization: Token <key>'; it is not shown again):")
        self.stdout.write(key)
