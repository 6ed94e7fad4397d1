"""A warehouse backend that is the interface and nothing more: every `WarehouseBackend`
method delegated to a real backend, none of a SQL backend's plain statements
(`execute`, `transaction()`, `table_exists`, ...). A caller that reaches past the
interface gets an AttributeError. `interface-only:<url>` wraps the backend of `<url>`."""
from __future__ import annotations

import abc
import inspect

from backfill_portal.backends import WarehouseBackend, backend_class, register_backend

PREFIX = "interface-only:"
#: The interface's methods: what a caller may call on any backend.
INTERFACE = tuple(sorted(name for name, member in vars(WarehouseBackend).items()
                         if inspect.isfunction(member) and not name.startswith("_")))
#: And the values it may read.
ATTRIBUTES = ("dialect", "schemes", "url", "lock_timeout_seconds", "idle_in_transaction_timeout_seconds")


def delegated(name: str):
    def method(self, *args, **kwargs):
        return getattr(self.inner, name)(*args, **kwargs)

    method.__name__ = method.__qualname__ = name
    return method


def delegating(cls):
    for name in INTERFACE:
        setattr(cls, name, delegated(name))
    return abc.update_abstractmethods(cls)


@register_backend("interface-only")
@delegating
class InterfaceOnlyWarehouse(WarehouseBackend):
    def __init__(self, url: str, **options):
        """`options` (the timeouts `get_warehouse` passes) go to the wrapped backend too."""
        super().__init__(url, **options)
        inner_url = url.removeprefix(PREFIX)
        self.inner = backend_class(inner_url)(inner_url, **options)
        self.dialect = self.inner.dialect
