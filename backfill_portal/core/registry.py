"""A named registry: the one shape every extension point shares (job kinds, executors,
verification checks, approval rules), after NetBox's `@register_data_backend` and
Healthchecks' `TRANSPORTS`.

A registry maps a name to one object, in registration order. Registering a name twice
is a configuration error, never a silent replacement; asking for a name nobody
registered is a `LookupError` that lists the names there are. `scoped()` undoes
whatever is registered (or unregistered) inside it, so a test can add a kind and leave
the registry as it found it.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

from django.core.exceptions import ImproperlyConfigured

T = TypeVar("T")


class NotRegistered(LookupError):
    """No object is registered under that name."""

    def __init__(self, noun: str, name: str, known: list[str]):
        self.noun, self.name, self.known = noun, name, known
        super().__init__(f"no {noun} {name!r} is registered (registered: {', '.join(known) or 'none'})")


class Registry(Generic[T]):
    def __init__(self, noun: str):
        self.noun = noun
        self._items: dict[str, T] = {}

    def register(self, name: str, item: T) -> T:
        if not name:
            raise ImproperlyConfigured(f"a {self.noun} needs a name")
        if name in self._items and self._items[name] is not item:
            raise ImproperlyConfigured(f"{self.noun} {name!r} is registered twice")
        self._items[name] = item
        return item

    def decorator(self, name: str) -> Callable[[T], T]:
        """`@registry.decorator("name")` registers what it decorates and returns it."""
        return lambda item: self.register(name, item)

    def unregister(self, name: str) -> None:
        if self._items.pop(name, None) is None:
            raise NotRegistered(self.noun, name, self.names())

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            raise NotRegistered(self.noun, name, self.names()) from None

    def names(self) -> list[str]:
        return list(self._items)

    def items(self) -> list[tuple[str, T]]:
        return list(self._items.items())

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[T]:
        return iter(list(self._items.values()))

    def __len__(self) -> int:
        return len(self._items)

    @contextmanager
    def scoped(self) -> Iterator[Registry[T]]:
        """Restore the registry's contents on exit, whatever was registered meanwhile."""
        saved = dict(self._items)
        try:
            yield self
        finally:
            self._items.clear()
            self._items.update(saved)
