"""Job kinds: what a kind of job needs, asked by the catalog loader, the approval plan
and the start-up check (never an if-chain on the kind's name).

A kind says which configuration fields a job of that kind must or may carry in the
catalog (they are copied into its definition, so into its code version hash), whether
it touches the outside world (a side-effect kind: skipped in a backfill unless
authorised, and then approved by the node's owner), whether it reads inputs, and how its
configuration is validated when the catalog loads. How a kind *runs* is not here: each
kind has an executor in `backfill_portal.execution.executors`, registered under the same
name, and a start-up check refuses a kind without one (or an executor without a kind).

    @register_kind
    class Shell(JobKindBase):
        name = "shell"
        label = "Shell command"
        required = {"command": "{kind} job {job} has no command"}

        def validate(self, config, *, job, reads):
            if ";" in config["command"]:
                yield "command", "one command, no ';'"
"""
from __future__ import annotations

import importlib
from collections.abc import Iterable, Iterator
from typing import ClassVar

from django.core.exceptions import ImproperlyConfigured

from backfill_portal.catalog.choices import JobKind
from backfill_portal.catalog.sqlcheck import TemplateError, check_template
from backfill_portal.core.registry import NotRegistered, Registry


class JobKindBase:
    """One kind of job. Subclass, set the class attributes, register with `@register_kind`."""

    name: ClassVar[str]
    label: ClassVar[str] = ""
    # field -> the message when a job of this kind lacks it ({kind}, {job} filled in)
    required: ClassVar[dict[str, str]] = {}
    optional: ClassVar[tuple[str, ...]] = ()
    has_side_effects: ClassVar[bool] = False
    reads_inputs: ClassVar[bool] = True

    def config_fields(self) -> tuple[str, ...]:
        return (*self.required, *self.optional)

    def validate(self, config: dict, *, job: str, reads: list[str]) -> Iterable[tuple[str, str]]:
        """Yield (field, problem) for what is wrong in `config` (the job's present
        configuration fields, required ones included). Runs at catalog load."""
        return ()

    def unavailable(self) -> str:
        """Why jobs of this kind cannot run with the configured warehouse ("" when they
        can): a request for one is refused when it is filed, not when its runs fail."""
        return ""

    def __repr__(self) -> str:
        return f"<job kind {self.name}>"


registry: Registry[JobKindBase] = Registry("job kind")


# Fields every job has, whatever its kind: a kind cannot claim one as its configuration.
COMMON_FIELDS = frozenset({"name", "description", "produces", "reads", "kind", "pool", "params", "depends_on_past",
                           "scheduled", "max_concurrent_runs", "max_attempts", "heartbeat_timeout_seconds"})


def register_kind(cls: type[JobKindBase]) -> type[JobKindBase]:
    clash = sorted(COMMON_FIELDS.intersection(cls().config_fields()))
    if clash:
        raise ImproperlyConfigured(f"job kind {cls.name!r} claims common job field(s) {', '.join(clash)}")
    registry.register(cls.name, cls())
    return cls


def unregister_kind(name: str) -> None:
    registry.unregister(name)


def kind_get(name: str) -> JobKindBase:
    """The registered kind; `NotRegistered` (a LookupError naming the known kinds) if none."""
    return registry.get(name)


def kind_unavailable(name: str) -> str:
    """Why jobs of kind `name` cannot run here ("" when they can): its `unavailable`, or
    that no such kind is registered in this process (a plugin no longer installed)."""
    try:
        return kind_get(name).unavailable()
    except LookupError as exc:
        return str(exc)


def kind_names() -> list[str]:
    return registry.names()


def side_effect_kinds() -> list[str]:
    return [k.name for k in registry if k.has_side_effects]


def has_side_effects(kind: str) -> bool:
    """Whether jobs of this kind touch the outside world (False for an unregistered kind,
    which the catalog refuses to load and the approval plan refuses to plan)."""
    return kind in registry and registry.get(kind).has_side_effects


def missing(value) -> bool:
    return value is None or value == "" or value == [] or value == {}


def validate_job_config(job: dict, *, name: str, reads: list[str]) -> tuple[JobKindBase | None, dict, list[tuple[str, str]]]:
    """(kind, definition fields, problems) for one catalog job entry: the kind must be
    registered, its required fields present, and its own validation satisfied."""
    kind_name = job.get("kind", JobKind.SQL)
    try:
        kind = kind_get(kind_name)
    except (NotRegistered, TypeError):
        return None, {}, [("kind", f"{kind_name!r} is not one of {', '.join(kind_names())}")]
    problems: list[tuple[str, str]] = []
    config = {}
    for field, message in kind.required.items():
        if missing(job.get(field)):
            problems.append((field, message.format(kind=kind.name, job=name)))
        else:
            config[field] = job[field]
    for field in kind.optional:
        if field in job:
            config[field] = job[field]
    if reads and not kind.reads_inputs:
        problems.append(("reads", f"{kind.name} job {name} reads no inputs"))
    if not problems:
        problems.extend(kind.validate(config, job=name, reads=reads))
    return kind, config, problems


def importable(target: str) -> bool:
    module, _, attr = str(target).rpartition(".")
    if not module:
        return False
    try:
        return callable(getattr(importlib.import_module(module), attr, None))
    except ImportError:
        return False


# -- the built-in kinds ------------------------------------------------------------------


@register_kind
class SqlKind(JobKindBase):
    """A SELECT template over the data interval and ref('upstream')."""

    name = JobKind.SQL.value
    label = str(JobKind.SQL.label)
    required = {"sql": "{kind} job {job} has no sql template"}

    def validate(self, config, *, job, reads) -> Iterator[tuple[str, str]]:
        try:
            check_template(config["sql"], upstreams=set(reads))
        except TemplateError as exc:
            yield "sql", str(exc)


@register_kind
class PythonKind(JobKindBase):
    """A callable that takes a RunContext and yields rows."""

    name = JobKind.PYTHON.value
    label = str(JobKind.PYTHON.label)
    required = {"callable": "'' is not an importable dotted path to a callable"}

    def validate(self, config, *, job, reads) -> Iterator[tuple[str, str]]:
        target = config["callable"]
        if not importable(target):
            yield "callable", f"{target!r} is not an importable dotted path to a callable"


@register_kind
class SideEffectKind(JobKindBase):
    """A node that tells the outside world (a notification, an external API), delivered
    once per upstream version."""

    name = JobKind.SIDE_EFFECT.value
    label = str(JobKind.SIDE_EFFECT.label)
    required = {"side_effect": "side-effect job {job} needs side_effect.channel"}
    has_side_effects = True

    def validate(self, config, *, job, reads) -> Iterator[tuple[str, str]]:
        effect = config["side_effect"]
        if not isinstance(effect, dict) or not effect.get("channel"):
            yield "side_effect", f"side-effect job {job} needs side_effect.channel"


@register_kind
class DbtKind(JobKindBase):
    """A dbt model, synced by `manage.py sync_dbt` (catalog/services/dbt_sync.py): each run
    compiles the frozen model with dbt for its interval, the upstreams bound to the pinned
    versions, and stages the compiled SELECT (execution/executors/dbt.py)."""

    name = "dbt"
    label = "dbt model"
    required = {"dbt": "{kind} job {job} has no dbt model (sync it with manage.py sync_dbt)"}

    def unavailable(self) -> str:
        from backfill_portal.catalog import dbt_project

        return "" if dbt_project.warehouse_has_dbt_adapter() else dbt_project.NO_ADAPTER

    def validate(self, config, *, job, reads) -> Iterator[tuple[str, str]]:
        model = config["dbt"]
        if not isinstance(model, dict) or not all(model.get(k) for k in ("project_dir", "model", "raw_code")):
            yield "dbt", f"dbt job {job} needs dbt.project_dir, dbt.model and dbt.raw_code (sync it with manage.py sync_dbt)"
