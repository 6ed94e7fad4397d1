"""Sync a dbt project (or its `target/manifest.json`) into the catalog: `manage.py sync_dbt`.

1. Load the project with dbt's own parser (or read the manifest: then the project is the
   directory above `target/`, which the runs compile with).
2. Map it, collecting every problem under `model <name>.<field>` (or `source ...`):
   sources -> source datasets; models -> datasets and `dbt` jobs; `depends_on` ->
   reads; `unique_key` -> business key; microbatch `event_time` / `batch_size` (or
   `meta.portal.time_column` / `grain`) -> time column and grain; `meta.owner` (or the
   group's owner) -> owner; the columns and their `data_type` (or `target/catalog.json`)
   -> columns; dbt tests -> the dataset's checks (blocking when `severity: error`); the
   model's checksum with the SQL of the macros it uses -> the code version. A model
   without a time column cannot run per interval: it is listed as refused, with the
   reason, and so is every model that reads it.
3. Compile every model and test with dbt, upstream relations as placeholders: a model
   that does not compile, reads the clock or reads a table outside ref()/source() is a
   problem of that model; each test becomes a check template over `{{ this }}`.
4. Nothing is written if there is any problem. Otherwise, in one transaction, upsert the
   teams, pools, datasets, jobs and lineage; a job whose definition changed gets a new
   code version (old ones kept). Each created or changed object gets an audit row.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.contrib.auth import get_user_model
from django.db import transaction

from backfill_portal.catalog import dbt_project
from backfill_portal.catalog.choices import Grain
from backfill_portal.catalog.models import CodeVersion, Dataset, Job, Pool, Team
from backfill_portal.catalog.services.sync import (
    IDENTIFIER,
    TEAM_NAME,
    CatalogError,
    SyncReport,
    definition_hash,
    tolerance_problems,
    whole_problem,
)
from backfill_portal.catalog.sqlcheck import TemplateError, check_template
from backfill_portal.core.services.audit import audit_record

KIND = "dbt"
DEFAULT_POOL = "dbt"
GRAINS = {"hour": Grain.HOUR, "day": Grain.DAY, "month": Grain.MONTH}
# dbt's data_type (as declared, or as the warehouse's catalog reports it) -> the portal's.
TYPES = {
    "text": "text", "varchar": "text", "character varying": "text", "string": "text", "char": "text",
    "character": "text", "integer": "integer", "int": "integer", "int4": "integer", "bigint": "integer",
    "int8": "integer", "smallint": "integer", "int2": "integer", "numeric": "numeric", "decimal": "numeric",
    "double precision": "numeric", "float": "numeric", "float8": "numeric", "real": "numeric",
    "timestamp": "timestamp", "timestamp without time zone": "timestamp", "timestamptz": "timestamp",
    "timestamp with time zone": "timestamp", "date": "date", "boolean": "boolean", "bool": "boolean",
}
CHECK_PREFIX = "dbt_"


class DbtSyncError(CatalogError):
    """The dbt project cannot be synced; `.fields` maps `model <name>.<field>` to problems."""


@dataclass
class DbtSyncReport(SyncReport):
    refused: list[tuple[str, str]] = field(default_factory=list)  # (model, reason)
    new_code_versions: list[str] = field(default_factory=list)  # jobs whose code version moved

    def lines(self) -> list[str]:
        out = [f"created {name}" for name in self.created]
        out += [f"changed {name}" for name in self.changed]
        out += [f"refused model {name}: {reason}" for name, reason in self.refused]
        out.append(f"{len(self.created)} created, {len(self.changed)} changed, {len(self.unchanged)} unchanged"
                   + (f", {len(self.refused)} refused" if self.refused else ""))
        return out


@dataclass
class _Project:
    manifest: object
    project_dir: Path
    name: str
    column_types: dict  # unique_id -> {column: type} from target/catalog.json, if any
    # What dbt compiles with: a manifest read from JSON lacks the generic tests' kwargs
    # (dbt keeps them in memory only), so a manifest.json's project is parsed for that.
    compile_manifest: object = None


def load_project(path: str | Path) -> _Project:
    """The manifest (parsed, or read from `target/manifest.json`) and the project dir."""
    path = Path(path)
    try:
        compile_manifest = None
        if path.is_dir():
            project_dir = path
            manifest = dbt_project.parse_project(path)
        elif path.is_file():
            project_dir = path.resolve().parent.parent
            if not (project_dir / "dbt_project.yml").is_file():
                raise DbtSyncError(
                    f"{path}: no dbt_project.yml in {project_dir}; the portal compiles each run's model with dbt, "
                    "so it needs the project: pass the project directory or its target/manifest.json", field="path")
            manifest = dbt_project.read_manifest(path)
            compile_manifest = dbt_project.parse_project(project_dir)
        else:
            raise DbtSyncError(f"{path}: no such dbt project or manifest.json", field="path")
    except dbt_project.DbtError as exc:
        raise DbtSyncError(str(exc), field="path") from None
    name = str(getattr(manifest.metadata, "project_name", "") or "")
    if not name:
        name = next((n.package_name for n in manifest.nodes.values() if n.resource_type == "model"), "dbt")
    return _Project(manifest, project_dir.resolve(), name, _catalog_types(project_dir / "target" / "catalog.json"),
                    compile_manifest or manifest)


def _catalog_types(path: Path) -> dict:
    import json

    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    out = {}
    for section in ("nodes", "sources"):
        for unique_id, entry in (doc.get(section) or {}).items():
            out[unique_id] = {name.lower(): str(col.get("type", "")) for name, col in (entry.get("columns") or {}).items()}
    return out


class _Problems:
    def __init__(self):
        self.fields: dict[str, list[str]] = {}
        self.first: str = ""

    def add(self, where: str, fld: str, message: str) -> None:
        self.fields.setdefault(f"{where}.{fld}", []).append(message)
        self.first = self.first or f"{where}: {fld}: {message}"

    def raise_if_any(self) -> None:
        if self.fields:
            count = sum(len(m) for m in self.fields.values())
            raise DbtSyncError(f"the dbt project has {count} problem(s); first: {self.first}", fields=self.fields)


def _meta(node) -> dict:
    meta = dict(getattr(node, "meta", None) or {})
    meta.update(getattr(node.config, "meta", None) or {})
    return meta


def _portal(meta: dict) -> dict:
    value = meta.get("portal")
    return value if isinstance(value, dict) else {}


def _owner(meta: dict, node, manifest, users, problems: _Problems, where: str):
    owner = meta.get("owner")
    fld = "meta.owner"
    if not owner and getattr(node, "group", None):
        group = next((g for g in manifest.groups.values() if g.name == node.group), None)
        if group is not None:
            owner = group.owner.name or group.owner.email
            fld = f"group {node.group} owner"
    if not owner:
        problems.add(where, "meta.owner", "no owner: set meta.owner (a portal user) or the group's owner")
        return None
    user = users.get(str(owner)) or next((u for u in users.values() if u.email and u.email == owner), None)
    if user is None:
        problems.add(where, fld, f"owner {owner!r} is not a user of the portal")
        return None
    return user.username


def _columns(node, types: dict, problems: _Problems, where: str) -> list[dict]:
    columns = []
    if not node.columns:
        problems.add(where, "columns", "no columns declared: declare them with data_type in the model's yml "
                                       "(or run `dbt docs generate` so that target/catalog.json has them)")
    for name, col in node.columns.items():
        declared = (col.data_type or types.get(name.lower()) or "").strip().lower()
        base = declared.split("(")[0].strip()
        if not IDENTIFIER.match(name):
            problems.add(where, f"columns.{name}", f"{name!r} is not a valid column name (lower case letters, digits, _)")
        elif not declared:
            problems.add(where, f"columns.{name}.data_type", "missing: declare data_type (or run `dbt docs generate`)")
        elif base not in TYPES:
            problems.add(where, f"columns.{name}.data_type", f"{declared!r} is not a type the portal knows "
                                                             f"({', '.join(sorted(set(TYPES)))})")
        else:
            columns.append({"name": name, "type": TYPES[base]})
    return columns


def _unique_tested(manifest, unique_id: str) -> list[str]:
    return sorted({t.column_name for t in manifest.nodes.values()
                   if t.resource_type == "test" and getattr(t, "test_metadata", None) is not None
                   and t.test_metadata.name == "unique" and t.column_name
                   and unique_id in t.depends_on.nodes and t.config.enabled})


def _business_key(config_key, portal: dict, tested: list[str], names: list[str], problems: _Problems,
                  where: str, fld: str) -> list[str]:
    key = portal.get("business_key") or config_key
    if isinstance(key, str):
        key = [k.strip() for k in key.split(",")] if key else []
    if not key and len(tested) == 1:
        key = tested
    if not key:
        problems.add(where, fld, "no business key: set unique_key (or a unique test on one column)")
        return []
    for k in key:
        if k not in names:
            problems.add(where, fld, f"{k!r} is not a column of the {where.split(' ')[0]} (columns: {', '.join(names)})")
    return list(key)


def _grain(value, problems: _Problems, where: str, fld: str) -> str:
    grain = str(value or "day").lower()
    if grain not in GRAINS:
        problems.add(where, fld, f"{grain!r}: the portal's grains are {', '.join(GRAINS)}")
        return Grain.DAY
    return GRAINS[grain]


def _tolerances(portal: dict, problems: _Problems, where: str) -> dict:
    tolerances, found = tolerance_problems(portal.get("tolerances"))
    for key, problem in found:
        problems.add(where, "meta.portal.tolerances" + (f".{key}" if key else ""), problem)
    return tolerances


def _limits(portal: dict, problems: _Problems, where: str) -> dict:
    """A job's limits from meta.portal (int() of `abc` was a ValueError, of `yes` 1 attempt)."""
    limits = {}
    for name, default in (("max_concurrent_runs", 4), ("max_attempts", 3), ("heartbeat_timeout_seconds", 60)):
        value = portal.get(name, default)
        if problem := whole_problem(value):
            problems.add(where, f"meta.portal.{name}", problem)
        limits[name] = value
    return limits


def _timezone(portal: dict, problems: _Problems, where: str) -> str:
    tz = str(portal.get("timezone") or "UTC")
    try:
        ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        problems.add(where, "meta.portal.timezone", f"{tz!r} is not an IANA timezone")
    return tz


def _team_and_pool(portal: dict, node, project: _Project, problems: _Problems, where: str) -> tuple[str, str]:
    team = str(portal.get("team") or getattr(node.config, "group", None) or project.name).replace("_", "-")
    pool = str(portal.get("pool") or DEFAULT_POOL)
    if not TEAM_NAME.match(team):
        problems.add(where, "meta.portal.team", f"{team!r} is not a valid team name")
    if not TEAM_NAME.match(pool):
        problems.add(where, "meta.portal.pool", f"{pool!r} is not a valid pool name")
    return team, pool


def _interval(node, portal: dict, names: list[str], problems: _Problems, where: str) -> tuple[str, str] | str:
    """(time column, grain), or the reason the model cannot run per interval."""
    config = node.config
    microbatch = config.materialized == "incremental" and getattr(config, "incremental_strategy", None) == "microbatch"
    if microbatch and config.event_time:
        column, grain, fld = config.event_time, _grain(config.batch_size, problems, where, "batch_size"), "event_time"
    elif portal.get("time_column"):
        column, grain = portal["time_column"], _grain(portal.get("grain"), problems, where, "meta.portal.grain")
        fld = "meta.portal.time_column"
    elif microbatch:
        return "a microbatch model without event_time: the portal cannot cut it into intervals"
    else:
        return ("no time column: not a microbatch model with event_time, and no meta.portal.time_column; "
                "the portal backfills a model one interval at a time")
    if column not in names:
        problems.add(where, fld, f"{column!r} is not a column of the model (columns: {', '.join(names)})")
    return column, grain


def _macros(manifest, node) -> dict[str, str]:
    """The SQL of every macro of the project (and its packages, not dbt's own, which the
    pinned dbt version fixes) that the model uses, directly or through other macros."""
    seen: dict[str, str] = {}
    todo = list(node.depends_on.macros)
    while todo:
        unique_id = todo.pop()
        macro = manifest.macros.get(unique_id)
        if unique_id in seen or macro is None or macro.package_name in ("dbt", "dbt_postgres"):
            continue
        seen[unique_id] = macro.macro_sql
        todo.extend(macro.depends_on.macros)
    return dict(sorted(seen.items()))


def _template(compiled_sql: str, names: list[str], *, this: str | None = None) -> str:
    """A portal template (`ref('x')`, `this`) of compiled SQL that reads the placeholders of `names`."""
    relations = {name: ("{{ this }}" if name == this else "{{ ref('" + name + "') }}") for name in names}
    try:
        return dbt_project.bind(compiled_sql, relations, jinja=True)
    except dbt_project.DbtError as exc:
        raise TemplateError(str(exc)) from None


def dbt_plan(project: _Project, *, users: dict) -> dict:
    """The normalised plan (teams, pools, datasets, jobs, refused), or DbtSyncError."""
    manifest, problems = project.manifest, _Problems()
    models = {uid: n for uid, n in manifest.nodes.items()
              if n.resource_type == "model" and n.config.enabled}
    dataset_of: dict[str, str] = {}
    refused: dict[str, str] = {}
    datasets: dict[str, dict] = {}
    jobs: dict[str, dict] = {}
    teams: set[str] = set()
    pools: set[str] = set()

    # Models first (which ones are runnable per interval), then the sources they read.
    for uid, node in models.items():
        where = f"model {node.name}"
        if node.config.materialized == "ephemeral":
            refused[uid] = "ephemeral: dbt inlines it into the models that read it; it has no table of its own"
            continue
        if getattr(node, "language", "sql") != "sql":
            refused[uid] = f"a {node.language} model: the portal compiles and stages SQL models"
            continue
        if not IDENTIFIER.match(node.name):
            problems.add(where, "name", f"{node.name!r} is not a valid dataset name (lower case letters, digits, _)")
            continue
        dataset_of[uid] = node.name
    changed = True
    while changed:  # a model that reads a refused model is refused too
        changed = False
        for uid in list(dataset_of):
            node = models[uid]
            for up in node.depends_on.nodes:
                reason = None
                if up in refused:
                    reason = f"reads model {models[up].name}, which is refused"
                elif up.startswith(("seed.", "snapshot.")):
                    reason = f"reads {up.split('.')[0]} {up.split('.')[-1]}: the portal knows models and sources only"
                if reason:
                    refused[uid] = reason
                    del dataset_of[uid]
                    changed = True
                    break

    for uid in list(dataset_of):
        node = models[uid]
        where = f"model {node.name}"
        meta = _meta(node)
        portal = _portal(meta)
        types = project.column_types.get(uid, {})
        names = [c["name"] for c in _columns(node, types, _Problems(), where)]
        interval = _interval(node, portal, names, _Problems(), where)
        if isinstance(interval, str):  # refused: its columns do not matter
            refused[uid] = interval
            del dataset_of[uid]
            continue
        _columns(node, types, problems, where)
        _interval(node, portal, names, problems, where)
    # Refusal for want of a time column propagates as well.
    changed = True
    while changed:
        changed = False
        for uid in list(dataset_of):
            up = next((u for u in models[uid].depends_on.nodes if u in refused), None)
            if up:
                refused[uid] = f"reads model {models[up].name}, which is refused"
                del dataset_of[uid]
                changed = True

    sources_used = {up for uid in dataset_of for up in models[uid].depends_on.nodes if up.startswith("source.")}
    for uid in sorted(sources_used):
        source = manifest.sources[uid]
        where = f"source {source.source_name}.{source.name}"
        name = source.identifier or source.name
        if not IDENTIFIER.match(name):
            problems.add(where, "identifier", f"{name!r} is not a valid dataset name (lower case letters, digits, _)")
            continue
        meta = _meta(source)
        meta = {**(source.source_meta or {}), **meta}
        portal = _portal(meta)
        columns = _columns(source, project.column_types.get(uid, {}), problems, where)
        names = [c["name"] for c in columns]
        time_column = getattr(source.config, "event_time", None) or portal.get("time_column")
        if not time_column:
            problems.add(where, "event_time", "missing: the portal reads a source one interval at a time by its "
                                              "event_time (or meta.portal.time_column)")
        elif time_column not in names:
            problems.add(where, "event_time", f"{time_column!r} is not a column of the source")
        team, _ = _team_and_pool(portal, source, project, problems, where)
        teams.add(team)
        dataset_of[uid] = name
        datasets[name] = {
            "description": source.description or "", "owner": _owner(meta, source, manifest, users, problems, where),
            "team": team, "timezone": _timezone(portal, problems, where), "grain": Grain.DAY,
            "business_key": _business_key(None, portal, _unique_tested(manifest, uid), names, problems, where,
                                          "meta.portal.business_key"),
            "core_measure": _measure(portal, names, problems, where), "columns": columns, "is_source": True,
            "time_column": time_column or "", "tolerances": dict(portal.get("tolerances") or {}),
            "source_measure_sql": "", "checks": [],
        }

    for uid, name in dataset_of.items():
        if not uid.startswith("model."):
            continue
        node = models[uid]
        where = f"model {node.name}"
        if name in datasets:
            problems.add(where, "name", f"{name} is also the name of a source; rename one of them")
            continue
        meta = _meta(node)
        portal = _portal(meta)
        columns = _columns(node, project.column_types.get(uid, {}), _Problems(), where)
        names = [c["name"] for c in columns]
        time_column, grain = _interval(node, portal, names, _Problems(), where)
        team, pool = _team_and_pool(portal, node, project, problems, where)
        teams.add(team)
        pools.add(pool)
        upstreams = {up: dataset_of[up] for up in node.depends_on.nodes if up in dataset_of}
        datasets[name] = {
            "description": node.description or "", "owner": _owner(meta, node, manifest, users, problems, where),
            "team": team, "timezone": _timezone(portal, problems, where), "grain": grain,
            "business_key": _business_key(node.config.unique_key, portal, _unique_tested(manifest, uid), names,
                                          problems, where, "unique_key"),
            "core_measure": _measure(portal, names, problems, where), "columns": columns, "is_source": False,
            "time_column": time_column, "tolerances": _tolerances(portal, problems, where),
            "source_measure_sql": "", "checks": [],
        }
        reads = sorted(set(upstreams.values()))
        depends_on_past = bool(portal.get("depends_on_past", False))
        definition = {
            "kind": KIND, "reads": reads, "params": {}, "depends_on_past": depends_on_past,
            "dbt": {
                "project": project.name, "project_dir": str(project.project_dir), "model": uid,
                "checksum": node.checksum.checksum, "raw_code": node.raw_code, "macros": _macros(manifest, node),
                "upstreams": dict(sorted(upstreams.items())), "dbt_version": dbt_project.dbt_version(),
            },
        }
        jobs[name] = {
            "description": node.description or "", "produces": name, "reads": reads, "kind": KIND, "pool": pool,
            "depends_on_past": depends_on_past, "has_side_effects": False,
            "scheduled": bool(portal.get("scheduled", False)), "definition": definition,
            **_limits(portal, problems, where),
        }
    problems.raise_if_any()
    _compile_and_check(project, dataset_of, datasets, jobs, problems)
    problems.raise_if_any()
    return {"teams": sorted(teams), "pools": sorted(pools), "datasets": datasets, "jobs": jobs,
            "refused": [(models[uid].name, reason) for uid, reason in sorted(refused.items(),
                                                                              key=lambda i: models[i[0]].name)]}


def _measure(portal: dict, names: list[str], problems: _Problems, where: str) -> str:
    measure = str(portal.get("core_measure") or "")
    if measure and measure not in names:
        problems.add(where, "meta.portal.core_measure", f"{measure!r} is not a column")
    return measure


def _compile_and_check(project: _Project, dataset_of: dict[str, str], datasets: dict, jobs: dict,
                       problems: _Problems) -> None:
    """Compile every mapped model and every test on one with dbt (placeholders for the
    relations), check each model's SQL as a job template, and turn tests into checks."""
    manifest = project.manifest
    by_dataset = {name: uid for uid, name in dataset_of.items()}
    tests = {}
    for uid, node in manifest.nodes.items():
        if node.resource_type != "test" or not node.config.enabled:
            continue
        targets = [up for up in node.depends_on.nodes if up.startswith("model.") and up in dataset_of]
        attached = getattr(node, "attached_node", None)
        if attached and attached.startswith("model."):
            target = attached if attached in dataset_of else None
        elif targets:
            # A singular test: it belongs to the last of the models it reads (the others
            # must be its upstreams, which its run pins).
            target = max(targets, key=lambda t: len(_ancestors(manifest, t)))
        else:
            target = None  # a test of a source or of a refused model: nothing the portal runs
        if target:
            tests[uid] = target
    models = [uid for uid in dataset_of if uid.startswith("model.")]
    try:
        with dbt_project.patched(project.compile_manifest, dataset_of):
            compiled = dbt_project.compile_nodes(project.compile_manifest, project.project_dir, [*models, *tests])
    except dbt_project.DbtError as exc:
        text = str(exc)
        failing = next((uid for uid in [*models, *tests] if f"in {_where(manifest, uid)} (" in text), None) or \
            next((uid for uid in [*models, *tests] if f"{_label_of(manifest, uid)}: dbt could not" in text), None)
        where = _where(manifest, tests.get(failing, failing)) if failing else "project"
        problems.add(where, "sql", str(exc))
        return
    for uid in models:
        name = dataset_of[uid]
        job = jobs[name]
        try:
            template = _template(compiled[uid], job["reads"])
            check_template(template, upstreams=set(job["reads"]))
        except TemplateError as exc:
            problems.add(f"model {manifest.nodes[uid].name}", "sql", str(exc))
    for uid, target in sorted(tests.items()):
        node = manifest.nodes[uid]
        name = dataset_of[target]
        reads = [name, *jobs[name]["reads"]]
        where = _where(manifest, target)
        try:
            sql = _template(compiled[uid], reads, this=name)
        except TemplateError as exc:
            problems.add(where, f"tests.{node.name}", f"{exc}: a test may read its model and the model's upstreams")
            continue
        severity = str(node.config.severity or "error").lower()
        datasets[name]["checks"].append({"name": (CHECK_PREFIX + node.name)[:64], "sql": sql,
                                         "blocking": severity == "error"})


def _ancestors(manifest, uid: str) -> set[str]:
    seen, todo = set(), [uid]
    while todo:
        node = manifest.nodes.get(todo.pop())
        for up in (node.depends_on.nodes if node is not None else ()):
            if up not in seen:
                seen.add(up)
                todo.append(up)
    return seen


def _label_of(manifest, uid: str) -> str:
    return dbt_project.node_label(uid)


def _where(manifest, uid: str) -> str:
    node = manifest.nodes[uid]
    return f"{node.resource_type} {node.name}"


# -- writing --------------------------------------------------------------------------


def _upsert(model, lookup: dict, values: dict, label: str, report: SyncReport, actor, reason: str, *,
            audit_type: str):
    obj = model.objects.filter(**lookup).first()
    if obj is None:
        obj = model.objects.create(**lookup, **values)
        report.created.append(label)
        audit_record(actor=actor, action="catalog.create", object_type=audit_type, object_id=lookup["name"],
                     reason=reason, data={"origin": "dbt", **{k: getattr(v, "pk", v) for k, v in values.items()}})
        return obj
    changes = {k: v for k, v in values.items() if getattr(getattr(obj, k), "pk", getattr(obj, k)) != getattr(v, "pk", v)}
    if changes:
        before = {k: getattr(getattr(obj, k), "pk", getattr(obj, k)) for k in changes}
        for k, v in changes.items():
            setattr(obj, k, v)
        obj.save()
        report.changed.append(label)
        audit_record(actor=actor, action="catalog.change", object_type=audit_type, object_id=lookup["name"],
                     reason=reason, data={"origin": "dbt", "before": before, "after": {k: getattr(v, "pk", v) for k, v in changes.items()}})
    else:
        report.unchanged.append(label)
    return obj


def _refuse_clashes(plan: dict) -> None:
    """A dbt model may not take over a dataset or job that the YAML catalog declares."""
    problems = _Problems()
    for name, job in plan["jobs"].items():
        existing = Job.objects.filter(name=name).first()
        if existing is not None and existing.kind != KIND:
            problems.add(f"model {name}", "name", f"job {name} exists and is a {existing.kind} job of the catalog, "
                                                  "not a dbt model: rename the model")
        dataset = Dataset.objects.filter(name=name).select_related("job").first()
        if dataset is not None and (dataset.is_source or getattr(dataset, "job", None) is None
                                    or dataset.job.kind != KIND):
            if existing is None or existing.kind == KIND:
                problems.add(f"model {name}", "name", f"dataset {name} exists and is not produced by a dbt model")
    for name, d in plan["datasets"].items():
        if d["is_source"]:
            existing = Dataset.objects.filter(name=name).first()
            if existing is not None and not existing.is_source:
                problems.add(f"source {name}", "identifier", f"dataset {name} exists and is not a source")
    problems.raise_if_any()


def dbt_sync(*, path: str | Path, actor=None, reason: str = "") -> DbtSyncReport:
    """Sync the dbt project at `path` (a directory or its target/manifest.json). Every
    audit row carries the actor and the reason (who synced and why), as the YAML
    catalog's do, and one `catalog.sync` row sums up a sync that changed anything."""
    reason = (reason or "").strip()
    project = load_project(path)
    users = {u.username: u for u in get_user_model().objects.all()}
    plan = dbt_plan(project, users=users)
    _refuse_clashes(plan)
    report = DbtSyncReport(refused=plan["refused"])
    with transaction.atomic():
        teams = {}
        for name in plan["teams"]:
            teams[name], made = Team.objects.get_or_create(name=name)
            if made:
                report.created.append(f"team {name}")
                audit_record(actor=actor, action="catalog.create", object_type="team", object_id=name,
                             reason=reason, data={"origin": "dbt"})
            else:
                report.unchanged.append(f"team {name}")
        pools = {}
        for name in plan["pools"]:
            pools[name], made = Pool.objects.get_or_create(name=name, defaults={"slots": 8, "reserved_for_production": 2})
            if made:
                report.created.append(f"pool {name}")
                audit_record(actor=actor, action="catalog.create", object_type="pool", object_id=name,
                             reason=reason, data={"origin": "dbt", "slots": 8, "reserved_for_production": 2})
            else:
                report.unchanged.append(f"pool {name}")
        datasets = {}
        for name, d in plan["datasets"].items():
            values = {**{k: v for k, v in d.items() if k not in ("owner", "team")},
                      "owner": users[d["owner"]], "team": teams[d["team"]]}
            existing = Dataset.objects.filter(name=name).first()
            if d["is_source"] and existing is not None and Job.objects.filter(upstreams=existing).exclude(kind=KIND).exists():
                # A source the YAML catalog's jobs read too: it is the catalog's to declare.
                report.unchanged.append(f"dataset {name}")
                datasets[name] = existing
                continue
            datasets[name] = _upsert(Dataset, {"name": name}, values, f"dataset {name}", report, actor, reason,
                                     audit_type="dataset")
        for name, j in plan["jobs"].items():
            values = {
                "description": j["description"], "dataset": datasets[j["produces"]], "kind": j["kind"],
                "depends_on_past": j["depends_on_past"], "has_side_effects": False,
                "max_concurrent_runs": j["max_concurrent_runs"], "max_attempts": j["max_attempts"],
                "heartbeat_timeout_seconds": j["heartbeat_timeout_seconds"], "scheduled": j["scheduled"],
                "pool": pools[j["pool"]], "definition": j["definition"],
            }
            job = _upsert(Job, {"name": name}, values, f"job {name}", report, actor, reason, audit_type="job")
            wanted = {datasets[u].pk for u in j["reads"]}
            if set(job.upstreams.values_list("pk", flat=True)) != wanted:
                job.upstreams.set(wanted)
            digest = code_digest(j["definition"])
            current = job.current_code_version
            if current is not None and code_digest(current.definition) == digest:
                # The same code, perhaps found in another directory (a checkout per release,
                # a CI workspace): where it lives is not the code. The version keeps its
                # hash and learns the new place, which its runs compile from.
                if current.definition != j["definition"]:
                    CodeVersion.objects.filter(pk=current.pk).update(definition=j["definition"])
                    current.definition = j["definition"]
            else:
                version, made = CodeVersion.objects.get_or_create(job=job, hash=digest,
                                                                  defaults={"definition": j["definition"]})
                previous = job.current_code_version.short_hash if job.current_code_version else None
                Job.objects.filter(pk=job.pk).update(current_code_version=version)
                job.current_code_version = version
                if previous:
                    report.changed.append(f"job {name} code version {previous} -> {version.short_hash}")
                    report.new_code_versions.append(name)
                audit_record(actor=actor, action="catalog.code_version", object_type="job", object_id=name,
                             dataset=j["produces"], reason=reason, data={"from": previous, "to": version.short_hash, "new": made,
                                                          "origin": "dbt", "model": j["definition"]["dbt"]["model"],
                                                          "checksum": j["definition"]["dbt"]["checksum"]})
        if report.created or report.changed:
            audit_record(actor=actor, action="catalog.sync", object_type="catalog", object_id=str(path)[-255:],
                         reason=reason, data={"origin": "dbt", "project": project.name, "created": report.created,
                                              "changed": report.changed, "unchanged": len(report.unchanged),
                                              "refused": [model for model, _ in report.refused]})
    return report


def code_digest(definition: dict) -> str:
    """A dbt job's code version: its definition without where the project sits on disk
    (`dbt.project_dir`), so the same model synced from another directory is the same
    version, not a new one that marks every published partition stale."""
    dbt = {k: v for k, v in (definition.get("dbt") or {}).items() if k != "project_dir"}
    return definition_hash({**definition, "dbt": dbt})


def code_checksum(definition: dict) -> str:
    """The model's checksum with its macros', as one digest (what the code version pins)."""
    dbt = definition.get("dbt") or {}
    text = dbt.get("checksum", "") + "".join(f"{k}:{hashlib.sha256(v.encode()).hexdigest()}"
                                             for k, v in sorted((dbt.get("macros") or {}).items()))
    return hashlib.sha256(text.encode()).hexdigest()
