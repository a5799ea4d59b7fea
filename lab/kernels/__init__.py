"""Triton kernels, one per file, each beside its PyTorch reference (and lab's few C++ CPU
kernels, `cpu_*.py` beside `cpu_*.cpp`: lab/kernels/cpu_ext.py).

Importing this package changes nothing in the process. Without CUDA, Triton kernels run in
Triton's interpreter, which a run switches on itself: `use_interpreter_without_cuda()` sets
`TRITON_INTERPRET=1` (unless the user set it), where a CPU run starts (the Worker calls it; so
does anything that launches a kernel outside an engine). Triton reads `TRITON_INTERPRET` when a
function is decorated, so the `@triton.jit` functions of modules imported before the call
(triton.language's own helpers: torch._dynamo imports it; lab's kernel modules, which the
PyTorch references beside them bring in) were compiled-mode JITFunctions, which the
interpreter cannot call: the call re-wraps them as interpreted functions. The interpreter runs
each program with numpy, is slow, and has no bf16 arithmetic.
"""

from __future__ import annotations

import logging
import os
import sys

import torch

# the modules whose @triton.jit functions a switch to the interpreter re-wraps
_JIT_MODULE_PREFIXES = ("triton.language", "lab.kernels")


def use_interpreter_without_cuda() -> bool:
    """Where there is no CUDA and TRITON_INTERPRET is unset: set TRITON_INTERPRET=1 in this
    process's environment (worker processes it starts inherit it) and re-wrap the @triton.jit
    functions decorated before (module docstring). Call it where a run starts, before a Triton
    kernel is launched; calling it again changes nothing. Returns whether Triton kernels run in
    the interpreter."""
    if not torch.cuda.is_available() and "TRITON_INTERPRET" not in os.environ:
        os.environ["TRITON_INTERPRET"] = "1"
        _interpret_loaded_jit_functions()
    return interpreter_active()


def _interpret_loaded_jit_functions() -> None:
    """Re-wrap the jit'd functions of already-imported triton.language and lab.kernels modules
    for the interpreter (one wrapper per function, so identity checks such as
    `combine_fn is _sum_combine` hold, and a kernel imported by name into another module is the
    same wrapper there)."""
    if "triton" not in sys.modules:
        return
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    wrapped: dict[int, tuple[JITFunction, InterpretedFunction]] = {}  # keeps originals alive
    modules = [m for n, m in list(sys.modules.items())
               if n.startswith(_JIT_MODULE_PREFIXES) and m is not None]
    for module in modules:
        for name, value in list(vars(module).items()):
            if isinstance(value, JITFunction):
                if id(value) not in wrapped:
                    wrapped[id(value)] = (value, InterpretedFunction(value.fn))
                setattr(module, name, wrapped[id(value)][1])


def warn_if_interpreted() -> bool:
    """Log (once per call site that asks) that Triton kernels will run in the interpreter;
    returns whether they will. The engine asks when its run launches Triton kernels (the PyTorch
    references beside them import this package too, without launching anything)."""
    if interpreter_active():
        logging.getLogger("lab").warning(
            "no CUDA: Triton kernels run in Triton's interpreter (slow; fp32/fp16 only)")
        return True
    return False


def interpreter_active() -> bool:
    """True when Triton kernels run in the interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def check_dtype_supported(t: torch.Tensor, what: str) -> None:
    """Raise ValueError when bf16 tensor `t` (named `what`) would go through the interpreter."""
    if t.dtype == torch.bfloat16 and (t.device.type == "cpu" or interpreter_active()):
        raise ValueError(
            f"{what} is bfloat16, but bf16 is not supported by Triton's interpreter; "
            "use dtype=float32 or float16 on CPU (or run on a CUDA device)"
        )


def num_warps_for(tile_elems: int) -> int:
    """Warps for a memory-bound program over `tile_elems` elements: ~16 elements per thread,
    1..16 warps (so 8-wide 128-bit bf16 accesses stay possible)."""
    return max(1, min(16, tile_elems // 512))
