from django.apps import AppConfig
from django.core import checks


class ExecutionConfig(AppConfig):
    name = "backfill_portal.execution"
    label = "execution"

    def ready(self):
        # Importing the packages registers every built-in executor and verification
        # check; the catalog's job-kind registry is below this layer and never imports it.
        from backfill_portal.execution import checks as verification_checks  # noqa: F401
        from backfill_portal.execution import executors  # noqa: F401

        checks.register(executors_match_kinds, checks.Tags.compatibility)


def executors_match_kinds(app_configs=None, **kwargs):
    """Start-up check: every job kind has an executor, every executor a kind."""
    from backfill_portal.execution.executors import registry_problems

    return [checks.Error(line, id="execution.E001") for line in registry_problems()]
