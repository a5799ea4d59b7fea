"""Weight-loading helpers shared by model families: reading safetensors, fused-name mapping, and
the strict check that names every missing, unexpected and mis-shaped tensor."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def safetensors_files(path: str | Path) -> list[Path]:
    """The checkpoint's weight files: the ones the index lists, else model.safetensors."""
    path = Path(path)
    index = path / INDEX_FILE
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [path / name for name in sorted(set(weight_map.values()))]
    if (path / SINGLE_FILE).exists():
        return [path / SINGLE_FILE]
    raise FileNotFoundError(f"{path} has neither {INDEX_FILE} nor {SINGLE_FILE}")


def safetensors_weights(path: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, tensor) from every weight file of a checkpoint, one tensor at a time."""
    for file in safetensors_files(path):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                yield name, f.get_tensor(name)


@dataclass(frozen=True)
class StackedMapping:
    """Checkpoint tensors stored inside one fused parameter: `.q_proj.` -> `.qkv_proj.` shard "q"."""

    entries: tuple[tuple[str, str, int | str], ...]  # (fused module, checkpoint module, shard id)

    def to_param(self, name: str) -> tuple[str, int | str | None]:
        """Checkpoint name -> (parameter name, shard id or None when not fused)."""
        for fused, part, shard in self.entries:
            if f".{part}." in name:
                return name.replace(f".{part}.", f".{fused}."), shard
        return name, None

    def to_checkpoint(self, param_name: str) -> list[str]:
        """Parameter name -> the checkpoint names that fill it."""
        names = [
            param_name.replace(f".{fused}.", f".{part}.")
            for fused, part, _ in self.entries
            if f".{fused}." in param_name
        ]
        return names or [param_name]


@dataclass
class WeightCheck:
    """Collects what a load saw; `finish` raises one ValueError naming every problem."""

    seen: set[str] = field(default_factory=set)
    unexpected: list[str] = field(default_factory=list)
    mis_shaped: list[str] = field(default_factory=list)

    def finish(self, expected: Iterable[str]) -> None:
        """Raise if a tensor was missing, unexpected or mis-shaped."""
        missing = sorted(set(expected) - self.seen)
        lines = [f"missing: {name}" for name in missing]
        lines += [f"unexpected: {name}" for name in sorted(self.unexpected)]
        lines += [f"mis-shaped: {msg}" for msg in sorted(self.mis_shaped)]
        if lines:
            raise ValueError("checkpoint does not match the model:\n  " + "\n  ".join(lines))
