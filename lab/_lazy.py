"""Lazy module attributes: a package names what it exports and imports each only when asked, so
importing the package (or one of its light modules) does not pull in torch."""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module


def lazy_getattr(package: str, exports: dict[str, str]) -> Callable[[str], object]:
    """A module-level `__getattr__` resolving `exports` (name -> module) on first access."""

    def __getattr__(name: str) -> object:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(import_module(exports[name]), name)

    return __getattr__
