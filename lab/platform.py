"""The machine: which device a `device` knob names, how many CPU cores this process may use.
torch is imported inside the functions that need it, so the light parts stay light."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def resolve_device(device: str) -> torch.device:
    """'auto' picks CUDA when it is available, else the CPU; a CUDA device must exist here."""
    import torch

    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError as e:
        raise ValueError(f"device={device!r} is invalid: use auto, cpu, cuda or cuda:N") from e
    if dev.type == "cuda":
        check_cuda_device(device, dev.index)
    return dev


def check_cuda_device(device: str, index: int | None) -> None:
    """Refuse a CUDA device this machine does not have, saying how to run on the CPU."""
    import torch

    if not torch.cuda.is_available():
        raise ValueError(f"device={device!r} is invalid: CUDA is unavailable on this machine "
                         "(no GPU, or torch built without CUDA); use device=cpu, or device=auto "
                         "to take CUDA when there is one and the CPU otherwise")
    count = torch.cuda.device_count()
    if index is not None and index >= count:
        raise ValueError(f"device={device!r} is invalid: this machine has {count} CUDA "
                         f"device(s), cuda:0 .. cuda:{count - 1}")


def usable_cpu_cores() -> int:
    """The CPU cores this process may run on (its affinity where the OS tells it)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return cores or 1


def rank_device(device: str, rank: int, world_size: int) -> torch.device:
    """The device of one rank: the CPU, or on CUDA (`auto`/`cuda` without an index) the GPU of
    index rank modulo the visible GPUs (always with an index: torch.cuda.set_device refuses a
    bare "cuda" on some torch versions, and tensors report theirs with one)."""
    import torch

    dev = resolve_device(device)
    if dev.type != "cuda" or dev.index is not None:
        return dev
    return torch.device("cuda", rank % torch.cuda.device_count() if world_size > 1 else 0)


def source_commit() -> str:
    """The commit of the lab checkout this runs from (with `+dirty` when it has changes), else
    lab's version."""
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=root, text=True,
                              capture_output=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=root, text=True, capture_output=True, timeout=10).stdout
        return head + ("+dirty" if dirty.strip() else "")
    except (OSError, subprocess.SubprocessError):
        from importlib.metadata import version

        return f"lab {version('lab')}"
