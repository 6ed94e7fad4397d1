from __future__ import annotations

import pytest

from tests.lineage.receiver import LineageReceiver
from tests.lineage.spec import ClientValidator, SpecValidator, spec_dir


@pytest.fixture
def receiver(settings):
    """A real HTTP receiver on a loopback port, and the portal told to send to it."""
    with LineageReceiver() as r:
        settings.OPENLINEAGE_URL = r.url
        settings.OPENLINEAGE_FILE = ""
        yield r


@pytest.fixture(scope="session")
def openlineage_spec():
    """The spec's own JSON schemas where they are here, else the client's classes
    generated from them (tests/lineage/spec.py)."""
    directory = spec_dir()
    return SpecValidator(directory) if directory is not None else ClientValidator()
