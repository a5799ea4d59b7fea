"""How a knob is declared: one dataclass field, `knob(default, help, rule...)`.

    @dataclass(frozen=True)
    class MyKnobs:
        victim_weight: float = knob(1.0, "how much a victim's KV blocks count", gt=0)

The field's annotation is its type (int, float, bool, str, tuple[int, ...], each optionally
`| None`); `knob()` adds the default, the help and the allowed range. Everything else is derived
from that one declaration: the config's default value (Hydra composes it), the check and its
message ("victim_weight=0 is invalid: must be a number > 0 (how much ...)"), the `lab knobs`
listing and the README's table. lab declares its own knobs this way (lab/config/knobs.py,
lab/sim/knobs.py) and so does a plug-in (see docs/plugins.md).
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

SPEC = "lab.knob"  # the field-metadata key of a knob's spec


@dataclass(frozen=True)
class KnobSpec:
    """The rule and help of one knob (field metadata; see `knob`)."""

    help: str
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    choices: tuple[str, ...] | None = None
    check: Callable[[Any], bool] | None = None  # a rule the bounds cannot say
    allowed: str | None = None  # what `check` allows, as the message says it
    null: str | None = None  # what null means, for a knob that may be null
    unit: str | None = None  # "GiB", "seconds": written into the allowed values
    details: str | None = None  # more than the help, for the README's table


def knob(default: Any, help: str, **rule: Any) -> Any:
    """A dataclass field declaring one knob: default, help, and its rule (`ge`, `gt`, `le`, `lt`,
    `choices`, or `check` with `allowed`; `null`, `unit`, `details`)."""
    spec = KnobSpec(help=help, **rule)
    if isinstance(default, list | tuple):
        return dataclasses.field(default_factory=lambda: tuple(default), metadata={SPEC: spec})
    return dataclasses.field(default=default, metadata={SPEC: spec})


@dataclass(frozen=True)
class Knob:
    """One declared knob as the rest of lab sees it: dotted name, type, default, spec."""

    name: str
    kind: type  # int, float, bool, str or tuple (of ints)
    nullable: bool
    default: Any
    spec: KnobSpec

    @property
    def help(self) -> str:
        return self.spec.help

    def ok(self, value: Any) -> bool:
        """Whether `value` (as the config holds it) is allowed."""
        if value is None:
            return self.nullable
        if not _is_kind(value, self.kind):
            return False
        if self.spec.check is not None and not self.spec.check(value):
            return False
        if self.spec.choices is not None and str(value).lower() not in self.spec.choices:
            return False
        items = value if self.kind is tuple else [value]
        return all(_in_bounds(v, self.spec) for v in items)

    def allowed(self) -> str:
        """The allowed values in words: 'null (...) or an integer >= 2'."""
        base = self.spec.allowed or _describe(self.kind, self.spec)
        if not self.nullable:
            return base
        return f"null ({self.spec.null}) or {base}" if self.spec.null else f"null or {base}"

    def refusal(self, value: Any) -> str:
        """The message refusing `value`: names the knob, the value, what it may be and why."""
        return f"{self.name}={show(value)} is invalid: must be {self.allowed()} ({self.help})"

    def convert(self, value: Any) -> Any:
        """A config value as the declared type (a list becomes a tuple of ints)."""
        if value is None or self.kind is not tuple:
            return value
        return tuple(int(v) for v in value)


def knobs_of(cls: type, prefix: str = "") -> list[Knob]:
    """The knobs a declaration dataclass declares, in field order; a field whose type is itself
    a declaration dataclass is a block (`slo.ttft_s`)."""
    return list(_declared_by(cls, prefix))


@functools.cache
def _declared_by(cls: type, prefix: str) -> tuple[Knob, ...]:
    """knobs_of, read once per class: `typing.get_type_hints` evaluates every (string)
    annotation again on each call, ~1 ms for lab's knobs, and a config's validation asks for
    them once per top-level key (a validation took 27 ms before this was kept, 4 ms after)."""
    hints = typing.get_type_hints(cls)
    found: list[Knob] = []
    for f in dataclasses.fields(cls):
        name = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(hints[f.name]):
            found += knobs_of(hints[f.name], f"{name}.")
        elif SPEC in f.metadata:
            kind, nullable = _kind_of(hints[f.name], name)
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            found.append(Knob(name, kind, nullable, default, f.metadata[SPEC]))
    return tuple(found)


def defaults_of(cls: type) -> dict[str, Any]:
    """{field: default} of a declaration as plain config values (blocks nested, tuples as lists):
    what Hydra composes before the command line's overrides."""
    out: dict[str, Any] = {}
    for k in knobs_of(cls):
        *blocks, leaf = k.name.split(".")
        target = out
        for block in blocks:
            target = target.setdefault(block, {})
        target[leaf] = list(k.default) if isinstance(k.default, tuple) else k.default
    return out


def build(cls: type, values: dict[str, Any]) -> Any:
    """An instance of a declaration from config values (only the keys it declares)."""
    hints = typing.get_type_hints(cls)
    own = {k.name: k for k in knobs_of(cls) if "." not in k.name}
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in values:
            continue
        if dataclasses.is_dataclass(hints[f.name]):
            kwargs[f.name] = build(hints[f.name], dict(values[f.name] or {}))
        else:
            kwargs[f.name] = own[f.name].convert(values[f.name])
    return cls(**kwargs)


def show(value: Any) -> str:
    """A value as the command line writes it: null, true, 16, 'cuda:x'."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return repr(value) if isinstance(value, str) else str(value)


def _kind_of(annotation: Any, name: str) -> tuple[type, bool]:
    """(base type, nullable) of a knob's annotation."""
    args = typing.get_args(annotation)
    nullable = type(None) in args and (isinstance(annotation, types.UnionType)
                                       or typing.get_origin(annotation) is typing.Union)
    if nullable:
        rest = [a for a in args if a is not type(None)]
        annotation = rest[0] if len(rest) == 1 else None
    base = typing.get_origin(annotation) or annotation
    if base not in (int, float, bool, str, tuple):
        raise TypeError(f"knob {name}: type {annotation!r} is not one of int, float, bool, str, "
                        "tuple[int, ...] (optionally | None)")
    return base, nullable


def _is_kind(value: Any, kind: type) -> bool:
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind is str:
        return isinstance(value, str)
    return (isinstance(value, Sequence) and not isinstance(value, str) and len(value) > 0
            and all(_is_kind(v, int) for v in value))


def _in_bounds(v: Any, s: KnobSpec) -> bool:
    if not isinstance(v, int | float) or isinstance(v, bool):
        return True
    return ((s.ge is None or v >= s.ge) and (s.gt is None or v > s.gt)
            and (s.le is None or v <= s.le) and (s.lt is None or v < s.lt))


NOUNS = {int: "an integer", float: "a number", bool: "true or false", str: "a string",
         tuple: "a list of integers"}


def _describe(kind: type, s: KnobSpec) -> str:
    """'an integer >= 1', 'a number in (0, 1]', 'a number of GiB > 0', 'one of a, b, c'."""
    if s.choices is not None:
        return "one of " + ", ".join(s.choices)
    noun = NOUNS[kind] + (f" of {s.unit}" if s.unit else "")
    low = ("[", s.ge) if s.ge is not None else ("(", s.gt) if s.gt is not None else None
    high = ("]", s.le) if s.le is not None else (")", s.lt) if s.lt is not None else None
    if low and high:
        return f"{noun} in {low[0]}{_num(low[1])}, {_num(high[1])}{high[0]}"
    if low:
        return f"{noun} {'>=' if low[0] == '[' else '>'} {_num(low[1])}"
    if high:
        return f"{noun} {'<=' if high[0] == ']' else '<'} {_num(high[1])}"
    return noun


def _num(x: float) -> str:
    """2**63 rather than 9223372036854775808."""
    if isinstance(x, int) and x >= 2**32 and x & (x - 1) == 0:
        return f"2**{x.bit_length() - 1}"
    return str(x)
