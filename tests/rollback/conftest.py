import pytest

from tests.reconciliation.helpers import deploy


@pytest.fixture
def ready(personas, demo_sources, task_queue, warehouse):
    """The test catalog (with the variants), source data, and the in-process queue."""
    deploy()
    return task_queue
