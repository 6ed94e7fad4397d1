"""Validation of events against the OpenLineage spec's own JSON schemas, offline.

No PyPI package ships the spec's schemas (openlineage-python has only the classes
generated from them), CI reaches no website, and this repository commits no fetched
files. So the schemas are read from a directory: `OPENLINEAGE_SPEC_DIR`, else
`shared/openlineage-spec` beside the checkout: the `spec/` folder of OpenLineage at tag
1.52.0, the release of the pinned client, whose facets' `_schemaURL`s are exactly those
files' `$id`s (`SpecValidator`). Without it, every event is instead rebuilt as the
client's own classes, which openlineage-python generates from those same schemas
(`ClientValidator`): each field's type, each required field, each enum, and the
classes' own validators (a UUID run id, a date-time with its time); the portal's own
facets against their schemas in docs/openlineage/. Either way the tests run.

Every event is validated as a RunEvent of OpenLineage.json (2-0-2), and every facet in
it against the schema its `_schemaURL` names: the spec's facet files, or the portal's
own (docs/openlineage/*.json). A facet whose schema is unknown fails.
"""
from __future__ import annotations

import enum
import importlib
import json
import os
import pkgutil
import re
import types
import typing
import uuid
from pathlib import Path

import attr

from dateutil import parser as dateparser
from jsonschema import Draft202012Validator
from referencing import Registry, Resource

ROOT = Path(__file__).resolve().parents[2]
RUN_EVENT = "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent"
SPEC_FACET_URL = re.compile(r"https://openlineage\.io/spec/facets/\d+-\d+-\d+/(?P<file>\w+)\.json#/\$defs/(?P<name>\w+)")


def spec_dir() -> Path | None:
    candidates = [os.environ.get("OPENLINEAGE_SPEC_DIR", ""), ROOT.parent / "shared" / "openlineage-spec"]
    for candidate in candidates:
        if candidate and (Path(candidate) / "OpenLineage.json").is_file():
            return Path(candidate)
    return None


class SpecValidator:
    def __init__(self, directory: Path):
        files = [directory / "OpenLineage.json", *sorted((directory / "facets").glob("*.json")),
                 *sorted((ROOT / "docs" / "openlineage").glob("*.json"))]
        documents = [json.loads(f.read_text()) for f in files]
        self.registry = Registry().with_resources(
            (doc["$id"], Resource.from_contents(doc)) for doc in documents)
        self.ids = {doc["$id"] for doc in documents}

    def _check(self, instance: dict, ref: str) -> None:
        Draft202012Validator({"$ref": ref}, registry=self.registry).validate(instance)

    def validate(self, event: dict) -> None:
        """Raises on the first violation: the event, then each facet by its _schemaURL."""
        self._check(event, RUN_EVENT)
        uuid.UUID(event["run"]["runId"])  # formats the schema names but does not assert
        dateparser.isoparse(event["eventTime"])
        for facet in facets_of(event):
            url = facet["_schemaURL"]
            assert url.split("#")[0] in self.ids, f"no schema for facet {url}"
            self._check(facet, url)


def facets_of(event: dict) -> list[dict]:
    found = [*event["run"].get("facets", {}).values(), *event["job"].get("facets", {}).values()]
    for dataset in [*event.get("inputs", []), *event.get("outputs", [])]:
        for key in ("facets", "inputFacets", "outputFacets"):
            found.extend(dataset.get(key, {}).values())
    return found


class ClientValidator:
    """An event checked against openlineage-python's classes generated from the spec:
    rebuilt field by field, so a missing required field, a value of the wrong type, an
    unknown enum value or a facet whose `_schemaURL` names no known schema raises."""

    def __init__(self):
        from openlineage.client import generated
        from openlineage.client.generated import base

        self.base = base
        self.facets: dict[str, type] = {}  # by the name a spec URL's `#/$defs/<name>` gives
        for info in pkgutil.iter_modules(generated.__path__):
            module = importlib.import_module(f"{generated.__name__}.{info.name}")
            for value in vars(module).values():
                if (isinstance(value, type) and attr.has(value) and issubclass(value, base.BaseFacet)
                        and value.__module__ == module.__name__ and module is not base):
                    self.facets[value.__name__] = value
        self.own: dict[str, dict] = {}
        for path in sorted((ROOT / "docs" / "openlineage").glob("*.json")):
            document = json.loads(path.read_text())
            for name, definition in document["$defs"].items():
                # allOf: the spec's facet base (the two fields every facet has), then its own part.
                own_part = next(p for p in definition["allOf"] if "$ref" not in p)
                self.own[f"{document['$id']}#/$defs/{name}"] = {
                    **own_part, "required": sorted({*own_part.get("required", ()), "_producer", "_schemaURL"})}

    def validate(self, event: dict) -> None:
        self._build(event, self.base.RunEvent, "event")

    def _facet(self, value: object, where: str):
        if not isinstance(value, dict) or not isinstance(value.get("_schemaURL"), str):
            raise AssertionError(f"{where}: a facet needs its _schemaURL")
        url = value["_schemaURL"]
        if url in self.own:
            Draft202012Validator(self.own[url]).validate(value)
            return value
        match = SPEC_FACET_URL.fullmatch(url)
        if not match or match["file"] != match["name"] or match["name"] not in self.facets:
            raise AssertionError(f"{where}: no schema for facet {url}")
        return self._build(value, self.facets[match["name"]], where)

    def _build(self, value: object, cls: type, where: str):
        if not isinstance(value, dict):
            raise AssertionError(f"{where}: expected an object for {cls.__name__}, got {value!r}")
        hints = typing.get_type_hints(cls)
        kwargs = {}
        for field in attr.fields(cls):
            if field.name not in value:
                if field.default is attr.NOTHING:
                    raise AssertionError(f"{where}: {cls.__name__} requires {field.name!r}")
                continue
            checked = self._value(value[field.name], hints[field.name], f"{where}.{field.name}")
            if field.init:  # `_schemaURL` is set by the class itself: checked, not passed
                kwargs[field.alias] = checked
        return cls(**kwargs)  # the class's own validators run here

    def _value(self, value: object, hint: object, where: str):
        origin, args = typing.get_origin(hint), typing.get_args(hint)
        if origin in (typing.Union, types.UnionType):
            if value is None and type(None) in args:
                return None
            errors = []
            for option in (a for a in args if a is not type(None)):
                try:
                    return self._value(value, option, where)
                except (AssertionError, ValueError, TypeError) as exc:
                    errors.append(str(exc))
            raise AssertionError(f"{where}: {value!r} fits none of {hint}: {errors}")
        if origin is list:
            if not isinstance(value, list):
                raise AssertionError(f"{where}: expected a list, got {value!r}")
            return [self._value(v, args[0], f"{where}[{i}]") for i, v in enumerate(value)]
        if origin is dict:
            if not isinstance(value, dict):
                raise AssertionError(f"{where}: expected an object, got {value!r}")
            return {k: self._value(v, args[1], f"{where}.{k}") for k, v in value.items()}
        if hint is typing.Any:
            return value
        if isinstance(hint, type) and issubclass(hint, self.base.BaseFacet):
            return self._facet(value, where)
        if isinstance(hint, type) and attr.has(hint):
            return self._build(value, hint, where)
        if isinstance(hint, type) and issubclass(hint, enum.Enum):
            return hint(value)  # ValueError on an unknown value
        if hint is bool:
            ok = isinstance(value, bool)
        elif hint is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif hint is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        elif hint is str:
            ok = isinstance(value, str)
        else:
            raise AssertionError(f"{where}: no check for the type {hint}")
        if not ok:
            raise AssertionError(f"{where}: expected {hint.__name__}, got {value!r}")
        return value
