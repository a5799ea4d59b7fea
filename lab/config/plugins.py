"""Plug-ins: packages outside lab that add options to its config groups, model presets and knobs
— for run.py, `lab run`, `lab serve` and `LLM(...)` alike, without editing lab.

Where lab looks (every composition, in this order after lab's own lab/conf):
1. installed plug-ins: each entry point of group `lab.plugins` names a `Plugin`
       # the plug-in's pyproject.toml
       [project.entry-points."lab.plugins"]
       my_plugin = "my_plugin:plugin"   # plugin = Plugin("my_plugin", "pkg://my_plugin.conf", MyKnobs)
2. `LAB_CONFIG_PATH`: directories (os.pathsep-separated; or pkg://module paths) of config
   groups, for options kept outside any package;
3. `LLM(..., config_path=[...])`: more directories for one engine.

A plug-in's config directory is laid out like lab/conf: `scheduler/my_policy.yaml`,
`model/my_preset.yaml`, ... (an option lab has under the same name wins). Its knobs are a
dataclass of `knob(...)` fields (lab/config/knob.py): top-level knobs like lab's own, set as
`run.py my_knob=2` or `LLM(..., my_knob=2)`, readable in its options' YAML as `${my_knob}`.
docs/plugins.md walks through a whole plug-in (examples/plugin/).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import import_module, resources
from importlib.metadata import entry_points
from pathlib import Path

from lab.config.knob import Knob, knobs_of

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "lab.plugins"
CONFIG_PATH_ENV = "LAB_CONFIG_PATH"
LAB_CONF = Path(__file__).resolve().parents[1] / "conf"  # lab/conf: lab's own options

# lab's own knob declarations: top-level ("") and blocks, each beside the code that reads it
# ("module:Class", imported when the knobs are first listed)
BUILTIN_KNOBS = {"": "lab.config.knobs:EngineKnobs", "sim": "lab.sim.knobs:SimKnobs"}


@dataclass(frozen=True)
class Plugin:
    """What one plug-in adds: a config directory (a path, or `pkg://module.path` inside its
    package) and/or a dataclass of top-level knobs."""

    name: str
    config: str | None = None
    knobs: type | None = None


@cache
def installed_plugins() -> tuple[Plugin, ...]:
    """The plug-ins installed in this environment (entry points of group `lab.plugins`), read
    once per process (`installed_plugins.cache_clear()` reads them again). One whose module
    cannot be imported (a package removed under its stale entry point, or broken) is left out
    with a warning naming it: its options are missing, lab's and the other plug-ins' are not."""
    found = []
    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        try:
            plugin = ep.load()
        except Exception as e:  # noqa: BLE001 - any import failure of a plug-in's own code
            log.warning("lab plug-in %r (%s) is left out: importing it failed: %s: %s; reinstall "
                        "it or uninstall its package", ep.name, ep.value, type(e).__name__, e)
            continue
        if not isinstance(plugin, Plugin):
            raise TypeError(f"entry point {ep.name} = {ep.value!r} of group {ENTRY_POINT_GROUP} "
                            f"must name a lab.config.plugins.Plugin, not {type(plugin).__name__}")
        found.append(plugin)
    return tuple(found)


def search_path(extra: Sequence[str | Path] = ()) -> list[str]:
    """Hydra search-path entries after lab's own: installed plug-ins, LAB_CONFIG_PATH, `extra`."""
    entries = [p.config for p in installed_plugins() if p.config]
    entries += [e for e in os.environ.get(CONFIG_PATH_ENV, "").split(os.pathsep) if e]
    entries += [str(e) for e in extra]
    return [_as_hydra_path(e) for e in entries]


def _as_hydra_path(entry: str) -> str:
    """A directory becomes file://ABSOLUTE; pkg:// and file:// entries stay."""
    if entry.startswith(("pkg://", "file://")):
        return entry
    path = Path(entry).expanduser().resolve()
    if not path.is_dir():
        raise ValueError(f"config path {entry!r} is not a directory (from {CONFIG_PATH_ENV}, a "
                         "plug-in or config_path=): it should hold config groups, e.g. "
                         "scheduler/my_policy.yaml")
    return f"file://{path}"


def config_dirs(extra: Sequence[str | Path] = ()) -> list[Path]:
    """Every config directory as a path: lab/conf first, then the search path."""
    dirs = [LAB_CONF]
    for entry in search_path(extra):
        if entry.startswith("file://"):
            dirs.append(Path(entry.removeprefix("file://")))
        else:
            package = entry.removeprefix("pkg://").replace("/", ".")
            dirs.append(Path(str(resources.files(package))))
    return dirs


def group_options(group: str, extra: Sequence[str | Path] = ()) -> list[str]:
    """The options of a config group, sorted: lab's and every plug-in's (`scheduler` ->
    ["fair", "fcfs", ..., "my_policy"])."""
    return sorted({p.stem for d in config_dirs(extra) for p in (d / group).glob("*.yaml")})


def option_files(group: str, extra: Sequence[str | Path] = ()) -> list[Path]:
    """Every option file of a group in every config directory (lab's first)."""
    return [p for d in config_dirs(extra) for p in sorted((d / group).glob("*.yaml"))]


def option_file(group: str, option: str, extra: Sequence[str | Path] = ()) -> Path | None:
    """The YAML file of an option, where Hydra would find it first (None: no such option)."""
    for d in config_dirs(extra):
        if (d / group / f"{option}.yaml").is_file():
            return d / group / f"{option}.yaml"
    return None


def knob_blocks(plugins: bool = True) -> dict[str, list[type]]:
    """{block: declaration classes}: "" (top-level knobs: lab's and, with `plugins`, every
    installed plug-in's), "sim"."""
    blocks: dict[str, list[type]] = {}
    for block, ref in BUILTIN_KNOBS.items():
        module, _, name = ref.partition(":")
        blocks.setdefault(block, []).append(getattr(import_module(module), name))
    if plugins:
        blocks[""] += [p.knobs for p in installed_plugins() if p.knobs is not None]
    return blocks


def declared_knobs(plugins: bool = True) -> list[Knob]:
    """Every knob declared (lab's, the simulator's and, with `plugins`, installed plug-ins'),
    dotted names; a name declared twice is refused, naming both declarations."""
    owner: dict[str, type] = {}
    found: list[Knob] = []
    for block, classes in knob_blocks(plugins).items():
        for cls in classes:
            for k in knobs_of(cls, f"{block}." if block else ""):
                if k.name in owner:
                    raise ValueError(f"knob {k.name!r} is declared twice: by "
                                     f"{owner[k.name].__module__}.{owner[k.name].__qualname__} "
                                     f"and {cls.__module__}.{cls.__qualname__}")
                owner[k.name] = cls
                found.append(k)
    return found
