"""A knob is one declaration (lab/config/knob.py): its default is what Hydra composes, its rule
what validation checks and says, its help what `lab knobs` and the README's table list. A
plug-in's knobs are declared the same way and join lab's."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from lab.config import plugins
from lab.config.compose import compose_config, set_knobs
from lab.config.knob import knob, knobs_of
from lab.config.listing import README_BEGIN, README_END, main, readme_block
from lab.config.plugins import Plugin, declared_knobs
from lab.config.validate import check_command_line, validate_config

README = Path(__file__).resolve().parents[2] / "README.md"


@dataclass(frozen=True)
class Example:
    count: int = knob(4, "how many", ge=1)
    share: float = knob(0.5, "a fraction", gt=0, le=1)
    size_gb: float | None = knob(None, "how large", gt=0, unit="GiB", null="as large as fits")
    flag: bool = knob(False, "on or off")
    mode: str = knob("a", "which mode", choices=("a", "b"))
    sizes: tuple[int, ...] | None = knob(None, "sizes", ge=1)
    even: int = knob(2, "an even number", check=lambda v: isinstance(v, int) and v % 2 == 0,
                     allowed="an even integer")


KNOBS = {k.name: k for k in knobs_of(Example)}


@pytest.mark.parametrize(("name", "allowed"), [
    ("count", "an integer >= 1"),
    ("share", "a number in (0, 1]"),
    ("size_gb", "null (as large as fits) or a number of GiB > 0"),
    ("flag", "true or false"),
    ("mode", "one of a, b"),
    ("sizes", "null or a list of integers >= 1"),
    ("even", "an even integer"),
])
def test_the_allowed_values_are_said_from_the_declaration(name, allowed):
    assert KNOBS[name].allowed() == allowed


@pytest.mark.parametrize(("name", "good", "bad"), [
    ("count", [1, 7], [0, 2.5, True, "3", None]),
    ("share", [1, 0.25], [0, 1.5, False]),
    ("size_gb", [None, 2, 0.5], [0, -1, "big"]),
    ("flag", [True, False], [1, "yes", None]),
    ("mode", ["a", "b"], ["c", 1]),
    ("sizes", [None, [1, 2], (4,)], [[], [0], [1, "2"], "1"]),
    ("even", [0, 4], [3, 1.0]),
])
def test_a_value_passes_exactly_when_the_declaration_allows_it(name, good, bad):
    assert all(KNOBS[name].ok(v) for v in good)
    assert not any(KNOBS[name].ok(v) for v in bad)


def test_a_refusal_names_the_knob_the_value_the_allowed_values_and_the_help():
    assert KNOBS["count"].refusal(0) == "count=0 is invalid: must be an integer >= 1 (how many)"
    assert KNOBS["mode"].refusal("c").startswith("mode='c' is invalid: must be one of a, b")


def test_an_unsupported_type_is_refused_at_declaration():
    @dataclass(frozen=True)
    class Bad:
        table: dict = knob(None, "a mapping")

    with pytest.raises(TypeError, match="knob table: type"):
        knobs_of(Bad)


def test_a_declaration_is_read_once_and_each_caller_gets_its_own_list():
    """knobs_of keeps what it read of a class (validation asks once per config key); a caller
    that changes the list it got changes nobody else's."""
    first = knobs_of(Example)
    first.clear()
    assert [k.name for k in knobs_of(Example)] == list(KNOBS)
    assert knobs_of(Example)[0] is KNOBS[next(iter(KNOBS))]  # the same Knob, not read again


def test_the_readme_table_is_the_generated_one():
    text = README.read_text()
    assert README_BEGIN in text and README_END in text
    assert readme_block() in text, "regenerate it: python -m lab.config.listing --markdown"


def test_lab_knobs_lists_every_knob(capsys):
    main([])
    out = capsys.readouterr().out
    for k in declared_knobs():
        assert f"{k.name} = " in out
    assert "sim.device = h100" in out and "allowed: an integer >= 1" in out


@dataclass(frozen=True)
class PluginKnobs:
    victim_weight: float = knob(1.0, "how much a victim's blocks count", gt=0)


@pytest.fixture
def with_plugin_knobs(monkeypatch):
    plugin = Plugin("example", knobs=PluginKnobs)
    monkeypatch.setattr(plugins, "installed_plugins", lambda: (plugin,))


def test_a_plugins_knob_is_composed_overridden_checked_and_set_by_keyword(with_plugin_knobs):
    assert compose_config().victim_weight == 1.0
    assert compose_config(["victim_weight=2.5"]).victim_weight == 2.5
    assert check_command_line(["victim_weight=2"]) is None
    with pytest.raises(ValueError, match=r"^victim_weight=0 is invalid: must be a number > 0"):
        validate_config(compose_config(["victim_weight=0"]))
    assert set_knobs(compose_config(), {"victim_weight": 3.0}).victim_weight == 3.0


def test_without_the_plugin_its_knob_is_an_unknown_setting():
    assert "unknown setting 'victim_weight'" in check_command_line(["victim_weight=2"])


def test_a_knob_declared_twice_is_refused_naming_both(monkeypatch):
    @dataclass(frozen=True)
    class Clash:
        max_num_seqs: int = knob(8, "clashes with lab's", ge=1)

    monkeypatch.setattr(plugins, "installed_plugins", lambda: (Plugin("clash", knobs=Clash),))
    with pytest.raises(ValueError, match="knob 'max_num_seqs' is declared twice: by "
                                         "lab.config.knobs.EngineKnobs and .*Clash"):
        declared_knobs()
