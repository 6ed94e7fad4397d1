import pytest

from tests.reconciliation.helpers import deploy


@pytest.fixture
def ready(personas, demo_sources, task_queue, warehouse):
    """The test catalog (with the variants), source data, and the in-process queue."""
    deploy()
    return task_queue


@pytest.fixture
def web(personas):
    """web('alice') -> a Django test Client logged in as that persona (real HTTP stack)."""
    from django.test import Client

    def client_for(name: str) -> Client:
        client = Client()
        client.force_login(personas[name])
        return client

    return client_for
