"""The machine: which device a `device` knob names, how many CPU cores this process may use.
torch is imported inside the functions that need it, so the light parts stay light."""

from __future__ import annotations

import itertools
import os
import subprocess
import time
from collections.abc import Mapping
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


def load_average() -> float:
    """The 1-minute load average (runnable and running processes, all of the machine's), 0.0
    where the OS does not report one."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return 0.0


def busy_cores(window_s: float = 0.3, samples: int = 3) -> float:
    """How many cores other processes keep busy now: the machine's busy CPU time (/proc/stat)
    less this process's own (/proc/self/stat), per second, in the quietest of `samples` equal
    parts of a short window. A sample of the present, not the 1-minute load average, whose past
    (a run that just ended) would take cores from a run that starts after it; the quietest part,
    so that work that holds a core throughout counts and a moment's (a command run beside the
    start) does not take a thread for the whole run. Where /proc is not there: the load
    average."""
    try:
        hz = os.sysconf("SC_CLK_TCK")
        marks = [(_machine_busy_ticks(), _own_ticks(), time.monotonic())]
        for _ in range(samples):
            time.sleep(window_s / samples)
            marks.append((_machine_busy_ticks(), _own_ticks(), time.monotonic()))
    except (OSError, ValueError, IndexError):
        return load_average()
    return max(0.0, min((b1 - b0 - (o1 - o0)) / hz / (t1 - t0)
                        for (b0, o0, t0), (b1, o1, t1) in itertools.pairwise(marks)))


def _machine_busy_ticks() -> int:
    """Every CPU's busy time so far, in clock ticks (/proc/stat's first line, less idle and
    iowait)."""
    with open("/proc/stat", encoding="ascii") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return sum(fields) - fields[3] - (fields[4] if len(fields) > 4 else 0)


def _own_ticks() -> int:
    """This process's CPU time so far (user + system), in clock ticks (/proc/self/stat)."""
    with open("/proc/self/stat", encoding="ascii") as f:
        after_name = f.read().rsplit(")", 1)[1].split()
    return int(after_name[11]) + int(after_name[12])


def auto_cpu_threads(reserve: int = 0, cores: int | None = None, busy: float | None = None,
                     env: Mapping[str, str] | None = None) -> int:
    """torch threads that do not fight other work for the cores: the usable cores minus the
    cores other processes keep busy now (busy_cores, rounded) minus `reserve`, at least 1. A
    parallel region waits for its slowest thread, so one thread on a core another process
    holds stalls every region of a step: at load ~6 on 2 cores, 2 threads decoded at 25-130 ms
    a step where 1 thread took 1.8 ms. An OMP_NUM_THREADS in the environment (a launcher's or
    the user's choice, which torch's own default obeys) replaces the count of free cores."""
    env = os.environ if env is None else env
    chosen = env.get("OMP_NUM_THREADS", "")
    if chosen.isdigit() and int(chosen) > 0:
        return max(1, int(chosen) - reserve)
    cores = usable_cpu_cores() if cores is None else cores
    busy = busy_cores() if busy is None else busy
    return max(1, min(cores, cores - round(busy)) - reserve)


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
