from django.apps import AppConfig
from django.core import checks


class ExecutionConfig(AppConfig):
    name = "backfill_portal.execution"
    label = "execution"

    def ready(self):
        from backfill_portal.backfills.services.run_control import RunControl, run_control_register
        from backfill_portal.core.outbox import outbox_sender_register
        from backfill_portal.execution.queue import send
        from backfill_portal.execution.services.dispatch import request_retry_failed, request_stop_runs

        # Backfills sits below execution and never imports it: what it needs from here
        # is handed over now. The outbox writer (core) sends each committed row through
        # the broker seam; cancelling and resuming a request stop or retry its runs.
        outbox_sender_register(send)
        run_control_register(RunControl(stop_runs=request_stop_runs, retry_failed=request_retry_failed))

        # Importing the packages registers every built-in executor and verification
        # check; the catalog's job-kind registry is below this layer and never imports it.
        from backfill_portal.execution import checks as verification_checks  # noqa: F401
        from backfill_portal.execution import executors  # noqa: F401

        checks.register(executors_match_kinds, checks.Tags.compatibility)


def executors_match_kinds(app_configs=None, **kwargs):
    """Start-up check: every job kind has an executor, every executor a kind."""
    from backfill_portal.execution.executors import registry_problems

    return [checks.Error(line, id="execution.E001") for line in registry_problems()]
