"""Each extension example is one module that registers on import. `extension(name)`
imports it with every registry scoped: what it registered is gone after the test, and
the module is forgotten, so the next test imports (and registers) it afresh and the rest
of the suite never sees it."""
from __future__ import annotations

import importlib
import sys
from contextlib import ExitStack, contextmanager

import pytest

from backfill_portal.backfills import approval_rules
from backfill_portal.catalog import kinds
from backfill_portal.execution import checks, executors

REGISTRIES = (kinds.registry, executors.registry, checks.registry, approval_rules.registry)


@contextmanager
def extension(module: str):
    with ExitStack() as stack:
        for registry in REGISTRIES:
            stack.enter_context(registry.scoped())
        sys.modules.pop(module, None)
        try:
            yield importlib.import_module(module)
        finally:
            sys.modules.pop(module, None)


@pytest.fixture
def seed_kind():
    with extension("tests.extending.seed_kind") as module:
        yield module


@pytest.fixture
def row_ceiling_check():
    with extension("tests.extending.row_ceiling_check") as module:
        yield module


@pytest.fixture
def finance_rule():
    with extension("tests.extending.finance_rule") as module:
        yield module
