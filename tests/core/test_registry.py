"""The registry every extension point shares."""
from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from backfill_portal.core.registry import NotRegistered, Registry


def test_a_name_registered_twice_is_a_configuration_error_not_a_replacement():
    registry = Registry("widget")
    first = registry.register("a", object())
    registry.register("a", first)  # the same object again (a module imported twice) is fine
    with pytest.raises(ImproperlyConfigured, match="widget 'a' is registered twice"):
        registry.register("a", object())
    assert registry.get("a") is first


def test_an_unknown_name_lists_the_registered_ones():
    registry = Registry("widget")
    registry.decorator("b")(len)
    registry.register("a", str)
    assert registry.names() == ["b", "a"]
    with pytest.raises(NotRegistered, match=r"no widget 'c' is registered \(registered: b, a\)"):
        registry.get("c")
    with pytest.raises(NotRegistered):
        registry.unregister("c")


def test_scoped_undoes_registrations_and_unregistrations_made_inside_it():
    registry = Registry("widget")
    registry.register("kept", int)
    with registry.scoped():
        registry.register("added", str)
        registry.unregister("kept")
        assert registry.names() == ["added"]
    assert registry.names() == ["kept"] and "added" not in registry
    with pytest.raises(RuntimeError), registry.scoped():
        registry.register("added", str)
        raise RuntimeError
    assert list(registry) == [int]
