"""Warehouse backends, chosen by the scheme of `WAREHOUSE_URL`.

A backend is a `WarehouseBackend` subclass registered for one or more URL schemes
(NetBox's `@register_data_backend`, Healthchecks' `TRANSPORTS`):

    @register_backend("sqlite")
    class SQLiteWarehouse(SqlWarehouse): ...

`get_warehouse()` returns the process's backend for `WAREHOUSE_URL` (one instance per
URL, which remembers what it has ensured), `make_warehouse(url)` a new unconnected
one, `backend_class(url)` the class a URL names. The built-in backends register when
this package first looks one up; another module registers by being imported before
(docs/extending.md, "A warehouse backend").
"""
from __future__ import annotations

import importlib
import threading
from urllib.parse import urlparse

from backfill_portal.backends.base import (
    AlreadyCommitted,
    ColumnSpec,
    DatasetSpec,
    Estimate,
    Marker,
    PointerMove,
    Profile,
    PublicationRecord,
    PublishConflict,
    PurgeRefused,
    READER_LAYOUTS,
    VersionNotCommitted,
    VersionNumbers,
    WarehouseBackend,
    WarehouseLockTimeout,
    WarehouseUnavailable,
    rounded_measure,
)
from backfill_portal.core.errors import ValidationError

__all__ = [
    "AlreadyCommitted",
    "ColumnSpec",
    "DatasetSpec",
    "Estimate",
    "Marker",
    "PointerMove",
    "Profile",
    "PublicationRecord",
    "PublishConflict",
    "PurgeRefused",
    "READER_LAYOUTS",
    "VersionNotCommitted",
    "VersionNumbers",
    "WarehouseBackend",
    "WarehouseLockTimeout",
    "WarehouseUnavailable",
    "backend_class",
    "check_warehouse_url",
    "get_warehouse",
    "make_warehouse",
    "probe_warehouse",
    "register_backend",
    "registered_schemes",
    "reset_warehouse_cache",
    "rounded_measure",
]

BUILTIN_BACKENDS = ("backfill_portal.backends.sqlite", "backfill_portal.backends.postgresql",
                    "backfill_portal.backends.iceberg")

_backends: dict[str, type[WarehouseBackend]] = {}
_builtins_loaded = False
_instances: dict[str, WarehouseBackend] = {}
_lock = threading.RLock()


def register_backend(*schemes: str):
    """Class decorator: `cls` serves WAREHOUSE_URLs with any of `schemes`. A scheme
    taken by another class is refused (two backends cannot both answer a URL)."""
    if not schemes:
        raise ValueError("register_backend needs at least one URL scheme")

    def register(cls: type[WarehouseBackend]) -> type[WarehouseBackend]:
        if not (isinstance(cls, type) and issubclass(cls, WarehouseBackend)):
            raise TypeError(f"{cls!r} is not a WarehouseBackend")
        with _lock:
            for scheme in schemes:
                taken = _backends.get(scheme)
                # The same class defined again (its module re-imported) takes its place.
                same = taken is not None and (taken.__module__, taken.__qualname__) == (cls.__module__, cls.__qualname__)
                if taken is not None and taken is not cls and not same:
                    raise ValueError(f"warehouse URL scheme {scheme!r} is already served by {taken.__qualname__}")
            for scheme in schemes:
                _backends[scheme] = cls
            cls.schemes = tuple(dict.fromkeys((*cls.__dict__.get("schemes", ()), *schemes)))
        return cls

    return register


def _load_builtins() -> None:
    global _builtins_loaded
    if not _builtins_loaded:
        with _lock:
            if not _builtins_loaded:
                for module in BUILTIN_BACKENDS:
                    importlib.import_module(module)
                _builtins_loaded = True


def registered_schemes() -> dict[str, type[WarehouseBackend]]:
    """{scheme: backend class} of every registered backend."""
    _load_builtins()
    return dict(sorted(_backends.items()))


def _scheme(url: str) -> str:
    # `postgresql+psycopg://` names the same backend as `postgresql://`.
    return urlparse(url).scheme.split("+")[0]


def backend_class(url: str) -> type[WarehouseBackend]:
    """The class serving `url`; ValidationError (one line naming the schemes there
    are) for a scheme no backend registered."""
    _load_builtins()
    scheme = _scheme(url or "")
    cls = _backends.get(scheme)
    if cls is None:
        known = ", ".join(sorted(_backends))
        raise ValidationError(
            f"WAREHOUSE_URL: unsupported warehouse URL scheme {urlparse(url or '').scheme!r} (known: {known})",
            field="WAREHOUSE_URL",
        )
    return cls


def make_warehouse(url: str, *, lock_timeout_seconds: int = 0, idle_in_transaction_timeout_seconds: int = 0,
                   publish_lock_timeout_seconds: float = 1.0, publish_wait_seconds: float = 300.0) -> WarehouseBackend:
    """A new backend for `url`, not cached and not connected (tests, a forked child
    that only needs the engine's value formats, health probes)."""
    return backend_class(url)(url, lock_timeout_seconds=lock_timeout_seconds,
                              idle_in_transaction_timeout_seconds=idle_in_transaction_timeout_seconds,
                              publish_lock_timeout_seconds=publish_lock_timeout_seconds,
                              publish_wait_seconds=publish_wait_seconds)


def get_warehouse(url: str | None = None) -> WarehouseBackend:
    """The process's backend for `url` (default: WAREHOUSE_URL), its bookkeeping
    ensured. One per URL per process: it remembers which datasets it has ensured, so a
    task does not look the schema up again on every call."""
    from django.conf import settings

    url = url or settings.WAREHOUSE_URL
    warehouse = _instances.get(url)
    if warehouse is None:
        with _lock:
            warehouse = _instances.get(url)
            if warehouse is None:
                warehouse = make_warehouse(
                    url, lock_timeout_seconds=settings.WAREHOUSE_LOCK_TIMEOUT_SECONDS,
                    idle_in_transaction_timeout_seconds=settings.WAREHOUSE_IDLE_IN_TRANSACTION_TIMEOUT_SECONDS,
                    publish_lock_timeout_seconds=settings.WAREHOUSE_PUBLISH_LOCK_TIMEOUT_SECONDS,
                    publish_wait_seconds=settings.WAREHOUSE_PUBLISH_WAIT_SECONDS)
                warehouse.ensure_meta()
                _instances[url] = warehouse
    return warehouse


def probe_warehouse(url: str | None = None, *, timeout: float | None = None) -> None:
    """Try a fresh connection to `url`'s warehouse (default: WAREHOUSE_URL) and
    nothing else: no cached backend is made or used, no schema looked at.
    WarehouseUnavailable if it refuses; a URL no backend serves: ValidationError."""
    from django.conf import settings

    make_warehouse(url or settings.WAREHOUSE_URL).probe(timeout=timeout)


def reset_warehouse_cache() -> None:
    """Forget the process's backends, closing this thread's connections to them
    (tests point WAREHOUSE_URL at a fresh database)."""
    with _lock:
        for warehouse in _instances.values():
            warehouse.close()
        _instances.clear()


def check_warehouse_url(url: str) -> str | None:
    """None if a registered backend serves `url`, else the one-line reason (for the
    settings check that runs at start)."""
    try:
        cls = backend_class(url)
    except ValidationError as exc:
        return str(exc)
    return cls.url_problem(url)
