from __future__ import annotations

import pytest

from tests.lineage.receiver import LineageReceiver
from tests.lineage.spec import SpecValidator, spec_dir


@pytest.fixture
def receiver(settings):
    """A real HTTP receiver on a loopback port, and the portal told to send to it."""
    with LineageReceiver() as r:
        settings.OPENLINEAGE_URL = r.url
        settings.OPENLINEAGE_FILE = ""
        yield r


@pytest.fixture(scope="session")
def openlineage_spec():
    directory = spec_dir()
    if directory is None:
        pytest.skip("the OpenLineage spec's JSON schemas are not here: set OPENLINEAGE_SPEC_DIR to the spec/ "
                    "folder of OpenLineage 1.52.0, or put it at shared/openlineage-spec beside the checkout")
    return SpecValidator(directory)
