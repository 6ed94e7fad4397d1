"""Sync the catalog file (YAML, declared as code) into the database.

1. Parse and validate the whole document first; every problem is collected with
   its path (`jobs[2].reads`), and nothing is written when there is any.
2. Check the lineage graph for cycles and SQL templates with the parser.
3. In one transaction: upsert teams, pools, datasets, jobs and lineage; a job whose
   definition hash changed gets a new code version (old ones are kept). Each created
   or changed object gets an audit row.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import yaml
from django.contrib.auth import get_user_model
from django.db import transaction

from backfill_portal.backends import READER_LAYOUTS, DatasetSpec
from backfill_portal.catalog.choices import COLUMN_TYPES, Grain
from backfill_portal.catalog.kinds import validate_job_config
from backfill_portal.catalog.models import CodeVersion, Dataset, Job, Pool, Team
from backfill_portal.catalog.sqlcheck import TemplateError, check_template
from backfill_portal.core.errors import ValidationError
from backfill_portal.core.services.audit import audit_record

IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
TEAM_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")


class CatalogError(ValidationError):
    """The catalog file is invalid; `.fields` maps each path to its problems."""


@dataclass
class SyncReport:
    created: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [f"created {name}" for name in self.created]
        out += [f"changed {name}" for name in self.changed]
        out.append(f"{len(self.created)} created, {len(self.changed)} changed, {len(self.unchanged)} unchanged")
        return out


def definition_hash(definition: dict) -> str:
    canonical = json.dumps(definition, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


CATALOG_VERSION = 1
CATALOG_KEYS = frozenset({"version", "teams", "pools", "datasets", "jobs"})


class _Validator:
    def __init__(self, doc):
        self.doc = doc
        self.errors: dict[str, list[str]] = {}

    def err(self, path: str, message: str) -> None:
        self.errors.setdefault(path, []).append(message)

    def items(self, key: str) -> list[dict]:
        value = self.doc.get(key) or []
        if not isinstance(value, list):
            self.err(key, "must be a list")
            return []
        out = []
        for i, item in enumerate(value):
            if not isinstance(item, dict):
                self.err(f"{key}[{i}]", "must be a mapping")
            else:
                out.append(item)
        return out


def catalog_parse(text: str) -> dict:
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CatalogError(f"the catalog is not valid YAML: {exc}", field="catalog") from None
    if not isinstance(doc, dict):
        raise CatalogError("the catalog must be a mapping with teams, pools, datasets and jobs", field="catalog")
    return doc


def catalog_validate(doc: dict) -> dict:
    """Return a normalised plan, or raise CatalogError naming every problem."""
    v = _Validator(doc)
    users = {u.username: u for u in get_user_model().objects.all()}
    # A file for another format (or a typo such as `dataset:`) is refused, not read as
    # "nothing declared": 0 created, 0 changed said nothing was wrong.
    version = doc.get("version", CATALOG_VERSION)
    if version != CATALOG_VERSION or isinstance(version, bool):
        v.err("version", f"catalog version {version!r} is not supported: this portal reads version {CATALOG_VERSION}")
    for key in sorted(set(doc) - CATALOG_KEYS, key=str):
        v.err(str(key), f"unknown key: a catalog has {', '.join(sorted(CATALOG_KEYS))}")

    teams = {}
    for i, t in enumerate(v.items("teams")):
        name = str(t.get("name", ""))
        if not TEAM_NAME.match(name):
            v.err(f"teams[{i}].name", f"{name!r} is not a valid team name")
            continue
        limit = t.get("max_concurrent_runs", 16)
        if not _whole(limit):
            v.err(f"teams[{i}].max_concurrent_runs", f"must be a whole number from 1 to {MAX_SETTING}")
        teams[name] = {"max_concurrent_runs": limit}

    pools = {}
    for i, p in enumerate(v.items("pools")):
        name = str(p.get("name", ""))
        if not TEAM_NAME.match(name):
            v.err(f"pools[{i}].name", f"{name!r} is not a valid pool name")
            continue
        slots, reserved = p.get("slots", 8), p.get("reserved_for_production", 0)
        if not _whole(slots):
            v.err(f"pools[{i}].slots", f"must be a whole number from 1 to {MAX_SETTING}")
        elif not isinstance(reserved, int) or isinstance(reserved, bool) or not 0 <= reserved < slots:
            v.err(f"pools[{i}].reserved_for_production", "must be an integer from 0 to slots - 1")
        pools[name] = {"slots": slots, "reserved_for_production": reserved}

    datasets = {}
    dataset_paths: dict[str, str] = {}  # a dataset's place in the file, for later messages
    for i, d in enumerate(v.items("datasets")):
        path = f"datasets[{i}]"
        name = str(d.get("name", ""))
        if not IDENTIFIER.match(name):
            v.err(f"{path}.name", f"{name!r} is not a valid dataset name (lower case letters, digits, _)")
            continue
        if name in datasets:
            v.err(f"{path}.name", f"dataset {name} is declared twice")
        dataset_paths.setdefault(name, path)
        owner = d.get("owner")
        if not owner:
            v.err(f"{path}.owner", f"dataset {name} has no owner")
        elif owner not in users:
            v.err(f"{path}.owner", f"owner {owner!r} of dataset {name} is not a user")
        team = d.get("team")
        if team not in teams:
            v.err(f"{path}.team", f"team {team!r} of dataset {name} is not declared under teams")
        tz = d.get("timezone", "UTC")
        try:
            ZoneInfo(str(tz))
        except (ZoneInfoNotFoundError, ValueError):
            v.err(f"{path}.timezone", f"{tz!r} is not an IANA timezone")
        grain = d.get("grain", "day")
        if grain not in Grain.values:
            v.err(f"{path}.grain", f"{grain!r} is not one of {', '.join(Grain.values)}")
        columns = d.get("columns") or []
        col_names = []
        if not isinstance(columns, list) or not columns:
            v.err(f"{path}.columns", f"dataset {name} declares no columns")
            columns = []
        col_types: dict[str, str] = {}
        for j, c in enumerate(columns):
            if not isinstance(c, dict) or not IDENTIFIER.match(str(c.get("name", ""))):
                v.err(f"{path}.columns[{j}]", "each column needs a valid name")
                continue
            if c.get("type") not in COLUMN_TYPES:
                v.err(f"{path}.columns[{j}].type", f"{c.get('type')!r} is not one of {', '.join(COLUMN_TYPES)}")
            col_names.append(c["name"])
            col_types[c["name"]] = c.get("type")
        key = d.get("business_key") or []
        if not isinstance(key, list) or not key:
            v.err(f"{path}.business_key", f"dataset {name} needs a business key (unique key columns)")
            key = []
        for k in key:
            if k not in col_names:
                v.err(f"{path}.business_key", f"key column {k!r} is not a declared column")
        measure = d.get("core_measure") or ""
        if measure and measure not in col_names:
            v.err(f"{path}.core_measure", f"{measure!r} is not a declared column")
        is_source = bool(d.get("source", False))
        time_column = d.get("time_column") or ""
        if is_source and time_column not in col_names:
            v.err(f"{path}.time_column", f"source {name} needs a time_column among its columns")
        partition_column = _partition_column(v, path, d, col_types, is_source=is_source)
        indexes = _indexes(v, path, d, col_names, is_source=is_source)
        reader_layout = _reader_layout(v, path, d, is_source=is_source)
        checks = d.get("checks") or []
        for j, chk in enumerate(checks if isinstance(checks, list) else []):
            if not isinstance(chk, dict) or not chk.get("name") or not chk.get("sql"):
                v.err(f"{path}.checks[{j}]", "a check needs a name and sql")
        datasets[name] = {
            "description": str(d.get("description", "")),
            "owner": owner, "team": team, "timezone": str(tz), "grain": grain,
            "business_key": list(key), "core_measure": measure,
            "columns": [{"name": c["name"], "type": c.get("type")} for c in columns if isinstance(c, dict) and "name" in c],
            "is_source": is_source, "time_column": time_column,
            "partition_column": partition_column, "indexes": indexes, "reader_layout": reader_layout,
            "tolerances": _tolerances(v, path, d),
            "source_measure_sql": str(d.get("source_measure_sql") or ""),
            "checks": [
                {"name": c["name"], "sql": c["sql"], "blocking": bool(c.get("blocking", True))}
                for c in checks if isinstance(c, dict) and c.get("name") and c.get("sql")
            ],
        }

    jobs = {}
    produced_by: dict[str, str] = {}
    for i, j in enumerate(v.items("jobs")):
        path = f"jobs[{i}]"
        name = str(j.get("name", ""))
        if not IDENTIFIER.match(name):
            v.err(f"{path}.name", f"{name!r} is not a valid job name")
            continue
        if name in jobs:
            v.err(f"{path}.name", f"job {name} is declared twice")
        produces = j.get("produces")
        if produces not in datasets:
            v.err(f"{path}.produces", f"job {name} produces {produces!r}, which is not a declared dataset")
        elif datasets[produces]["is_source"]:
            v.err(f"{path}.produces", f"{produces} is a source: it is read, never produced")
        elif produces in produced_by:
            v.err(f"{path}.produces", f"{produces} is already produced by job {produced_by[produces]}")
        else:
            produced_by[produces] = name
        reads = j.get("reads") or []
        if not isinstance(reads, list):
            v.err(f"{path}.reads", "must be a list of dataset names")
            reads = []
        for up in reads:
            if up not in datasets:
                v.err(f"{path}.reads", f"upstream {up!r} of job {name} is not a declared dataset")
        kind = j.get("kind", "sql")
        kind_spec, config, problems = validate_job_config(j, name=name, reads=reads)
        for field_name, problem in problems:
            v.err(f"{path}.{field_name}", problem)
        definition: dict = {"kind": kind, "reads": sorted(reads), "params": j.get("params") or {}, **config}
        definition["depends_on_past"] = bool(j.get("depends_on_past", False))
        pool = j.get("pool", "default")
        if pool not in pools:
            v.err(f"{path}.pool", f"pool {pool!r} is not declared under pools")
        limits = {}
        for key_name, default in (("max_concurrent_runs", 4), ("max_attempts", 3), ("heartbeat_timeout_seconds", 60)):
            value = j.get(key_name, default)
            # (YAML's `yes` is a bool, which Python counts as an int.) A database integer holds 2**31 - 1.
            if not _whole(value):
                v.err(f"{path}.{key_name}", f"must be a whole number from 1 to {MAX_SETTING}")
            limits[key_name] = value
        jobs[name] = {
            "description": str(j.get("description", "")),
            "produces": produces, "reads": list(reads), "kind": kind, "pool": pool,
            "depends_on_past": bool(j.get("depends_on_past", False)),
            "has_side_effects": bool(kind_spec and kind_spec.has_side_effects),
            "scheduled": bool(j.get("scheduled", False)),
            "definition": definition, **limits,
        }

    for name, d in datasets.items():
        path = dataset_paths[name]
        if not d["is_source"] and not any(p == path or p.startswith(f"{path}.") for p in v.errors):
            # What the warehouse backends will be told (spec_for): refused here, with
            # its path, rather than at a run's first staging.
            try:
                DatasetSpec(name=name, columns=tuple((c["name"], c["type"]) for c in d["columns"]),
                            business_key=tuple(d["business_key"]), core_measure=d["core_measure"],
                            partition_column=d["partition_column"], indexes=tuple(map(tuple, d["indexes"])),
                            reader_layout=d["reader_layout"])
            except ValidationError as exc:
                for field_name in exc.fields or {"name": [exc.message]}:
                    target = "name" if field_name == "dataset" else field_name
                    v.err(f"{path}.{target}", exc.message)
        producer = jobs.get(produced_by.get(name, ""))
        if d["source_measure_sql"] and producer:
            try:
                check_template(d["source_measure_sql"], upstreams=set(producer["reads"]))
            except TemplateError as exc:
                v.err(f"{path}.source_measure_sql", str(exc))
    if not v.errors:
        cycle = _find_cycle(jobs)
        if cycle:
            v.err("jobs", "lineage has a cycle: " + " -> ".join(cycle))
    if v.errors:
        first_path, first = next(iter(v.errors.items()))
        count = sum(len(m) for m in v.errors.values())
        raise CatalogError(f"the catalog has {count} problem(s); first: {first_path}: {first[0]}", fields=v.errors)
    return {"teams": teams, "pools": pools, "datasets": datasets, "jobs": jobs}


def _partition_column(v: _Validator, path: str, d: dict, col_types: dict[str, str], *, is_source: bool) -> str:
    """`partition_column`: a declared text column that holds the partition key in every
    row (what readers filter a partition by); absent or empty: the bookkeeping `_partition`."""
    name = d.get("partition_column") or ""
    if not name:
        return ""
    if is_source:
        v.err(f"{path}.partition_column", "a source is read as it is: it has no versions and no partition column")
    elif not isinstance(name, str) or name not in col_types:
        v.err(f"{path}.partition_column", f"{name!r} is not a declared column")
    elif col_types[name] != "text":
        v.err(f"{path}.partition_column",
              f"{name!r} is declared {col_types[name]}; the partition column holds the partition key "
              "('2022-10-01', '2022-10-01T03') and must be a text column")
    else:
        return name
    return ""


# The tolerances a dataset may set (catalog/tolerances.py): numbers, and one switch.
TOLERANCE_NUMBERS = ("row_band", "measure_rel")
TOLERANCE_SWITCHES = ("row_band_blocking",)
MAX_SETTING = 2**31 - 1  # what a database integer column holds


def _whole(value) -> bool:
    """A limit from 1 to MAX_SETTING (YAML's `yes` is a bool, which Python counts as 1)."""
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_SETTING


def tolerance_problems(raw) -> tuple[dict, list[tuple[str, str]]]:
    """A dataset's `tolerances` (the YAML catalog's, a dbt model's meta.portal), checked:
    row_band and measure_rel are numbers from 0 (relative distances), row_band_blocking
    is true or false; other keys are custom checks' settings (a number, true/false or
    text). (The valid ones, [(key or "", problem)].) A wrong one was stored as it was and
    failed every verification of the dataset's runs, which then waited in `staged`."""
    if raw is None:
        return {}, []
    if not isinstance(raw, dict):
        return {}, [("", "must be a mapping (row_band, measure_rel, row_band_blocking)")]
    out, problems = {}, []
    for key, value in raw.items():
        if key in TOLERANCE_NUMBERS:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
                problems.append((key, f"must be a number from 0 (a relative distance), not {value!r}"))
                continue
        elif key in TOLERANCE_SWITCHES:
            if not isinstance(value, bool):
                problems.append((key, f"must be true or false, not {value!r}"))
                continue
        elif not isinstance(value, (int, float, str)):  # a custom check's own setting (docs/extending.md)
            problems.append((key, f"must be a number, true/false or text, not {value!r}"))
            continue
        out[key] = value
    return out, problems


def _tolerances(v: _Validator, path: str, d: dict) -> dict:
    tolerances, problems = tolerance_problems(d.get("tolerances"))
    for key, problem in problems:
        v.err(f"{path}.tolerances" + (f".{key}" if key else ""), problem)
    return tolerances


def whole_problem(value) -> str:
    """"" when `value` is a limit from 1 to MAX_SETTING, else what is wrong."""
    return "" if _whole(value) else f"must be a whole number from 1 to {MAX_SETTING}, not {value!r}"


def _reader_layout(v: _Validator, path: str, d: dict, *, is_source: bool) -> str:
    """`reader_layout`: "partitioned" or "table" (backends.READER_LAYOUTS); absent or
    empty: chosen by the grain (spec_for)."""
    value = d.get("reader_layout") or ""
    if not value:
        return ""
    if is_source:
        v.err(f"{path}.reader_layout", "a source is read as it is: it has no versions to show")
    elif value not in READER_LAYOUTS:
        v.err(f"{path}.reader_layout", f"{value!r} is not a reader layout (one of {', '.join(READER_LAYOUTS)})")
    else:
        return value
    return ""


def _indexes(v: _Validator, path: str, d: dict, col_names: list[str], *, is_source: bool) -> list[list[str]]:
    """`indexes`: a list of indexes, each a list of declared column names (or one name),
    created on every version so that readers' usual filters are as fast as on a table
    of their own."""
    value = d.get("indexes")
    if value in (None, []):
        return []
    if is_source:
        v.err(f"{path}.indexes", "a source is read as it is: the warehouse keeps no versions of it to index")
        return []
    if not isinstance(value, list):
        v.err(f"{path}.indexes", "must be a list of indexes, each a list of column names")
        return []
    out: list[list[str]] = []
    for j, index in enumerate(value):
        where = f"{path}.indexes[{j}]"
        columns = [index] if isinstance(index, str) else index
        if not isinstance(columns, list) or not columns or not all(isinstance(c, str) for c in columns):
            v.err(where, "an index is a non-empty list of column names")
            continue
        unknown = [c for c in columns if c not in col_names]
        if unknown:
            verb = "is not a declared column" if len(unknown) == 1 else "are not declared columns"
            v.err(where, f"{', '.join(repr(c) for c in unknown)} {verb}")
        elif len(set(columns)) != len(columns):
            v.err(where, f"index {columns!r} names a column twice")
        elif columns in out:
            v.err(where, f"index {columns!r} is declared twice")
        else:
            out.append(list(columns))
    return out


def _find_cycle(jobs: dict) -> list[str] | None:
    """Datasets are nodes; a job is an edge from each upstream to the dataset it produces."""
    edges: dict[str, list[str]] = {}
    for job in jobs.values():
        for up in job["reads"]:
            edges.setdefault(up, []).append(job["produces"])
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in edges.get(node, ()):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if not state.get(nxt):
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if not state.get(node):
            found = visit(node)
            if found:
                return found
    return None


def _upsert(model, lookup: dict, values: dict, label: str, report: SyncReport, actor, reason: str) -> object:
    obj = model.objects.filter(**lookup).first()
    if obj is None:
        obj = model.objects.create(**lookup, **values)
        report.created.append(label)
        audit_record(actor=actor, action="catalog.create", object_type=model.__name__.lower(),
                     object_id=lookup["name"], reason=reason, data=_jsonable(values))
        return obj
    changes = {k: v for k, v in values.items() if _current(obj, k) != _jsonable_value(v)}
    if changes:
        before = {k: _current(obj, k) for k in changes}
        for k, val in changes.items():
            setattr(obj, k, val)
        obj.save()
        report.changed.append(label)
        audit_record(actor=actor, action="catalog.change", object_type=model.__name__.lower(), object_id=lookup["name"],
                     reason=reason, data={"before": before, "after": _jsonable(changes)})
    else:
        report.unchanged.append(label)
    return obj


def _current(obj, key):
    value = getattr(obj, key)
    return value.pk if hasattr(value, "pk") else value


def _jsonable_value(value):
    return value.pk if hasattr(value, "pk") else value


def _jsonable(values: dict) -> dict:
    return {k: _jsonable_value(v) for k, v in values.items()}


def catalog_sync(*, text: str, actor=None, reason: str = "", source: str = "") -> SyncReport:
    """Create or change what the catalog text declares, in one transaction. Every audit
    row carries the actor and the reason (who synced and why: an approver reading a code
    version's diff sees them), and one `catalog.sync` row sums the sync up (`source`:
    where the text came from, e.g. the file's path)."""
    plan = catalog_validate(catalog_parse(text))
    reason = (reason or "").strip()
    report = SyncReport()
    users = {u.username: u for u in get_user_model().objects.filter(
        username__in={d["owner"] for d in plan["datasets"].values()})}
    with transaction.atomic():
        teams = {name: _upsert(Team, {"name": name}, vals, f"team {name}", report, actor, reason)
                 for name, vals in plan["teams"].items()}
        pools = {name: _upsert(Pool, {"name": name}, vals, f"pool {name}", report, actor, reason)
                 for name, vals in plan["pools"].items()}
        datasets = {}
        for name, d in plan["datasets"].items():
            values = {**{k: v for k, v in d.items() if k not in ("owner", "team")},
                      "owner": users[d["owner"]], "team": teams[d["team"]]}
            datasets[name] = _upsert(Dataset, {"name": name}, values, f"dataset {name}", report, actor, reason)
        for name, j in plan["jobs"].items():
            values = {
                "description": j["description"], "dataset": datasets[j["produces"]], "kind": j["kind"],
                "depends_on_past": j["depends_on_past"], "has_side_effects": j["has_side_effects"],
                "max_concurrent_runs": j["max_concurrent_runs"], "max_attempts": j["max_attempts"],
                "heartbeat_timeout_seconds": j["heartbeat_timeout_seconds"], "scheduled": j["scheduled"],
                "pool": pools[j["pool"]], "definition": j["definition"],
            }
            job = _upsert(Job, {"name": name}, values, f"job {name}", report, actor, reason)
            wanted = {datasets[u].pk for u in j["reads"]}
            if set(job.upstreams.values_list("pk", flat=True)) != wanted:
                job.upstreams.set(wanted)
            digest = definition_hash(j["definition"])
            if job.current_code_version is None or job.current_code_version.hash != digest:
                version, made = CodeVersion.objects.get_or_create(
                    job=job, hash=digest, defaults={"definition": j["definition"]})
                previous = job.current_code_version.short_hash if job.current_code_version else None
                Job.objects.filter(pk=job.pk).update(current_code_version=version)
                job.current_code_version = version
                if previous:
                    report.changed.append(f"job {name} code version {previous} -> {version.short_hash}")
                audit_record(actor=actor, action="catalog.code_version", object_type="job", object_id=name,
                             dataset=j["produces"], reason=reason,
                             data={"from": previous, "to": version.short_hash, "new": made})
        if report.created or report.changed:
            audit_record(actor=actor, action="catalog.sync", object_type="catalog", object_id=(source or "text")[-255:],
                         reason=reason, data={"created": report.created, "changed": report.changed,
                                              "unchanged": len(report.unchanged)})
    return report


def catalog_sync_file(*, path: str | Path, actor=None, reason: str = "") -> SyncReport:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise CatalogError(f"cannot read the catalog file {path}: {exc.strerror}", field="path") from None
    return catalog_sync(text=text, actor=actor, reason=reason, source=str(path))
