"""What every verification check shares: its result row and the context it reads."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import ClassVar

from backfill_portal.execution.executors.base import LazyPins, render
from backfill_portal.execution.models import Run
from backfill_portal.catalog.specs import spec_for


@dataclass
class Check:
    """One result: stored as a CheckResult row, shown on the run's page."""

    name: str
    passed: bool
    blocking: bool = True
    observed: dict = field(default_factory=dict)
    message: str = ""


class CheckContext:
    """The staged version under verification. The warehouse profile (rows, keys,
    measure), the pinned inputs and the version's own relation are read once, when a
    check first asks for them."""

    def __init__(self, run: Run, warehouse):
        self.run = run
        self.warehouse = warehouse
        self.dataset = run.job.dataset
        self.spec = spec_for(self.dataset)
        self.tolerances: dict = self.dataset.tolerances or {}

    @cached_property
    def profile(self):
        return self.warehouse.profile(spec=self.spec, run_id=self.run.run_id)

    @cached_property
    def pins(self) -> LazyPins:
        return LazyPins(self.run, self.warehouse)

    @cached_property
    def this_sql(self) -> str:
        """The staged version as a relation: `{{ this }}` in a check's template."""
        return self.warehouse.ref_sql(spec=self.spec, pins={self.run.partition_key: self.run.run_id})

    def render(self, template: str) -> str:
        """A check template rendered against the run's pinned inputs and `this`."""
        return render(template, run=self.run, warehouse=self.warehouse, pins=self.pins, this_sql=self.this_sql)


class VerificationCheck:
    """Subclass, set `name` and `order`, implement `run`, register with `@register_check`.
    `run` yields its results: usually one, none when it does not apply, several for a
    check that runs data (the catalog's SQL assertions)."""

    name: ClassVar[str]
    order: ClassVar[int]
    blocking: ClassVar[bool] = True

    def run(self, ctx: CheckContext) -> Iterable[Check]:
        raise NotImplementedError

    def result(self, passed: bool, *, observed: dict | None = None, message: str = "",
               blocking: bool | None = None) -> Check:
        return Check(self.name, passed, blocking=self.blocking if blocking is None else blocking,
                     observed=observed if observed is not None else {}, message=message)

    def __repr__(self) -> str:
        return f"<verification check {self.name}>"
