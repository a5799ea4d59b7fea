"""Triton kernels, one per file, each beside its PyTorch reference.

Importing any kernel module imports this package first. Without CUDA (and unless the user chose
otherwise) it switches Triton to its interpreter, before any `@triton.jit` below runs: triton
reads `TRITON_INTERPRET` when a function is decorated. If triton.language was imported earlier
(torch._dynamo does), its own jit'd helpers (tl.sum, tl.max, tl.sigmoid, ...) were compiled-mode
JITFunctions, which the interpreter cannot call; they are re-wrapped as interpreted functions.
The interpreter runs each program with numpy, is slow, and has no bf16 arithmetic.
"""

from __future__ import annotations

import logging
import os
import sys

import torch


def _interpret_loaded_triton_language() -> None:
    """Re-wrap the jit'd helpers of already-imported triton.language modules for the interpreter
    (one wrapper per function, so identity checks such as `combine_fn is _sum_combine` hold)."""
    if "triton.language" not in sys.modules:
        return
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    wrapped: dict[int, tuple[JITFunction, InterpretedFunction]] = {}  # keeps originals alive
    modules = [m for n, m in list(sys.modules.items()) if n.startswith("triton.language") and m]
    for module in modules:
        for name, value in list(vars(module).items()):
            if isinstance(value, JITFunction):
                if id(value) not in wrapped:
                    wrapped[id(value)] = (value, InterpretedFunction(value.fn))
                setattr(module, name, wrapped[id(value)][1])


if not torch.cuda.is_available() and "TRITON_INTERPRET" not in os.environ:
    os.environ["TRITON_INTERPRET"] = "1"
    _interpret_loaded_triton_language()


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
