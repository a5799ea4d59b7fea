"""Installed plug-ins are read from their entry points; one that cannot be imported (its package
removed or broken under a stale entry point) is left out with a warning naming it, and fails
only its own options, not every engine and command of lab."""

from __future__ import annotations

import logging
from importlib.metadata import EntryPoint

import pytest

from lab.config import plugins
from lab.config.plugins import ENTRY_POINT_GROUP, Plugin, installed_plugins

GOOD = Plugin("good")  # what the good entry point names (this module's attribute)


@pytest.fixture
def entry_points(monkeypatch):
    """Replace the environment's entry points of group lab.plugins with the given ones."""
    def use(*eps: EntryPoint) -> None:
        monkeypatch.setattr(plugins, "entry_points", lambda group: list(eps)
                            if group == ENTRY_POINT_GROUP else [])
        installed_plugins.cache_clear()
    yield use
    installed_plugins.cache_clear()


def test_a_plugin_that_cannot_be_imported_is_left_out_with_a_warning(entry_points, caplog):
    entry_points(EntryPoint("broken", "lab_no_such_plugin_module:plugin", ENTRY_POINT_GROUP),
                 EntryPoint("good", f"{__name__}:GOOD", ENTRY_POINT_GROUP))
    with caplog.at_level(logging.WARNING, logger="lab.config.plugins"):
        assert installed_plugins() == (GOOD,)
    (record,) = caplog.records
    assert "broken" in record.getMessage()
    assert "lab_no_such_plugin_module" in record.getMessage()
    assert plugins.search_path() == []  # composition goes on without it


def test_an_entry_point_naming_no_plugin_is_still_refused(entry_points):
    entry_points(EntryPoint("odd", "lab.config.plugins:ENTRY_POINT_GROUP", ENTRY_POINT_GROUP))
    with pytest.raises(TypeError, match="must name a lab.config.plugins.Plugin"):
        installed_plugins()
