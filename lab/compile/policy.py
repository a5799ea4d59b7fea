"""Whether a worker compiles its model when the `compile` knob is null (auto, the default).

    compile=true / false     as given (true is refused where compile cannot run: config check)
    compile=null (auto)      compiled when all of these hold, else eager:

      the device is a CPU        on CUDA, CUDA graphs already take the step's host work away;
                                 compile there is an explicit compile=true (not measured as a
                                 default)
      one rank                   compile's limit (tensor_parallel_size=1)
      enforce_eager=false        vLLM's opt-out: neither compile nor graphs
      >= AUTO_COMPILE_MIN_PARAMS the model's parameters; below it (the embedded tiny models)
                                 a whole run takes less than the compile's start-up
      a C++ compiler on PATH     inductor's CPU code is C++ ($CXX, else g++)

What compile buys and costs on a CPU (start-up, tok/s against eager and against vLLM-CPU) is in
the README's performance section and docs/compile.md.
"""

from __future__ import annotations

import os
import shutil

import torch

#: a model with fewer parameters runs eagerly under compile=null: 10 M parameters sits between
#: the embedded tiny test models (well under 1 M) and bench_llama (29 M), whose 16-request
#: offline batch compile makes ~1.2x faster for ~10 s of start-up
AUTO_COMPILE_MIN_PARAMS = 10_000_000


def should_compile(knob: bool | None, device: torch.device, num_params: int, tp_size: int,
                   enforce_eager: bool) -> tuple[bool, str]:
    """(compile or not, why) for the `compile` knob (None: auto) and this worker."""
    if knob is not None:
        return knob, f"compile={str(knob).lower()}"
    why_not = eager_reason(device, num_params, tp_size, enforce_eager)
    if why_not:
        return False, f"compile=null (auto): eager, {why_not}"
    return True, (f"compile=null (auto): compiled ({num_params / 1e6:.0f} M parameters on the "
                  "CPU; compile=false runs eagerly)")


def eager_reason(device: torch.device, num_params: int, tp_size: int, enforce_eager: bool) -> str:
    """Why compile=null runs this worker eagerly ('' when it compiles)."""
    if torch.device(device).type != "cpu":
        return "the device is not a CPU (compile=true compiles)"
    if tp_size > 1:
        return f"tensor_parallel_size={tp_size} (compile runs one rank)"
    if enforce_eager:
        return "enforce_eager=true"
    if num_params < AUTO_COMPILE_MIN_PARAMS:
        return (f"the model has {num_params / 1e6:.2f} M parameters, under "
                f"{AUTO_COMPILE_MIN_PARAMS / 1e6:.0f} M (compile=true compiles)")
    if not has_cxx():
        return "no C++ compiler for inductor ($CXX or g++ on PATH)"
    return ""


def has_cxx() -> bool:
    """Whether the C++ compiler inductor uses on a CPU ($CXX, else g++) is on PATH."""
    return shutil.which(os.environ.get("CXX") or "g++") is not None
