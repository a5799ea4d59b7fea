"""`kernels=cpu`: lab's C++ CPU kernels behind the kernels seam (lab/conf/kernels/cpu.yaml).

    python run.py kernels=cpu                         # explicit: a kernel that cannot be built
                                                      # fails engine start, naming it
    python run.py                                     # kernels=auto on a CPU: this option with
                                                      # fallback=true (the reference instead)
    python run.py kernels=cpu kernels.gemms.fp32._target_=lab.kernels.cpu_sgemm.OrderedGemm
    python run.py kernels=cpu kernels.argmax=null     # one slot back to its PyTorch reference

The table ops (RMSNorm, rotary, SiLU·mul, MoE, block copy, rejection sampler, quantized GEMMs)
are the PyTorch references, as TorchOps; what this option adds, each slot a `_target_` (null: the reference):

    gemms    dense linears: after loading, each weight is packed for the first slot that takes
             it (its dtype, `min_elements`, its shape) and runs there, eager and compiled:
               bf16    lab.kernels.cpu_gemm.AMXGemm      AMX tiles (CPU with AMX-BF16)
               fp32    lab.kernels.cpu_sgemm.BlockedGemm lab's AVX-512 kernel (K in blocks)
               mkl     lab.kernels.cpu_sgemm.MKLGemm     MKL's packed sgemm (no AVX-512)
               onednn  OneDNNGemm (here)                 torch's oneDNN-prepacked matmul
             a weight no slot takes runs F.linear (the reference)
    argmax   the sampler's greedy pick: lab.kernels.cpu_argmax.CPUArgmax (fp32 CPU logits)

`setup(device, dtype)` (the Worker, before the model loads, so before the engine reports
ready) builds or loads the extensions of the slots a `dtype` model uses, in this install's
build directory (lab/kernels/cpu_ext.py); nothing is built later. A slot whose kernel cannot be
built fails the engine's start (`fallback: false`, kernels=cpu) or runs its reference with one
warning (`fallback: true`, what kernels=auto picks on a CPU). A slot that does not apply to the
machine (no AMX, no MKL, no AVX-512) is skipped either way.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F

from lab.kernels.cpu_argmax import CPUArgmax
from lab.kernels.cpu_ext import CPUKernelUnavailable, PackedGemm
from lab.layers.ops import LayerOps

log = logging.getLogger(__name__)


class OneDNNGemm(PackedGemm):
    """A weight prepacked for oneDNN (torch's `mkldnn._reorder_linear_weight`, packed for a batch
    of `batch_hint` rows) and its matmul: what vLLM's CPU backend and inductor's freezing use;
    nothing to build. Under torch.compile it is F.linear (inductor packs the weight for oneDNN
    itself and fuses the op after; it cannot take a weight packed outside the graph)."""

    dtypes = (torch.float32, torch.bfloat16)

    def __init__(self, min_elements: int = 0, batch_hint: int = 16) -> None:
        super().__init__(min_elements)
        if batch_hint < 1:
            raise ValueError(f"batch_hint={batch_hint} is invalid: use an int >= 1")
        self.batch_hint = batch_hint

    def applies(self) -> bool:
        return torch.backends.mkldnn.is_available() and hasattr(
            torch.ops.mkldnn, "_reorder_linear_weight")

    def supports(self, weight: torch.Tensor) -> bool:
        return (weight.device.type == "cpu" and weight.dtype in self.dtypes
                and weight.dim() == 2 and weight.is_contiguous())

    def pack(self, weight: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), self.batch_hint)

    def gemm(self, x: torch.Tensor, packed: torch.Tensor, weight: torch.Tensor,
             bias: torch.Tensor | None = None) -> torch.Tensor:
        if torch.compiler.is_compiling():
            return F.linear(x, weight, bias)
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")

    def __repr__(self) -> str:
        return f"OneDNNGemm(min_elements={self.min_elements}, batch_hint={self.batch_hint})"


class CPUOps(LayerOps):
    """The `kernels=cpu` option (module docstring)."""

    def __init__(self, gemms: Mapping[str, PackedGemm | None] | None = None,
                 argmax: CPUArgmax | None = None, fallback: bool = False) -> None:
        super().__init__("torch")
        self.name = "cpu"
        if not isinstance(fallback, bool):
            raise ValueError(f"kernels.fallback={fallback!r} is invalid: use true or false")
        if gemms is not None and not isinstance(gemms, Mapping):
            raise ValueError(f"kernels.gemms={gemms!r} is invalid: give a mapping of slot names "
                             "to PackedGemm _target_s (lab/conf/kernels/cpu.yaml)")
        for slot, kernel in (gemms or {}).items():
            if kernel is not None and not isinstance(kernel, PackedGemm):
                raise ValueError(f"kernels.gemms.{slot} is a {type(kernel).__name__}: give a "
                                 "PackedGemm's _target_ (lab/kernels/cpu_ext.py) or null")
        self.gemms = {slot: k for slot, k in (gemms or {}).items() if k is not None}
        self.argmax = argmax
        self.fallback = fallback
        self.active: dict[str, PackedGemm] = {}  # the slots that run, after setup
        self.argmax_ready = False

    def setup(self, device: torch.device, dtype: torch.dtype) -> None:
        """Build or load the kernels of the slots a `dtype` model on `device` uses (module
        docstring); ValueError for a device other than the CPU."""
        device = torch.device(device)
        if device.type != "cpu":
            raise ValueError(f"kernels=cpu runs on a CPU device, the run's is {device}: use "
                             "kernels=auto, triton or torch")
        self.active = {slot: k for slot, k in self.gemms.items()
                       if dtype in k.dtypes and self._set_up(f"gemms.{slot}", k.setup)}
        self.argmax_ready = self.argmax is not None and self._set_up("argmax", self.argmax.setup)
        log.info("kernels=cpu, %s: linears on %s; argmax: %s", dtype,
                 ", ".join(f"{s} ({type(k).__name__})" for s, k in self.active.items())
                 or "F.linear", type(self.argmax).__name__ if self.argmax_ready else "torch")

    def _set_up(self, slot: str, setup: Callable[[], bool]) -> bool:
        """Run one slot's setup; a kernel that cannot be built raises (fallback false) or is
        reported and left out (fallback true)."""
        try:
            return setup()
        except CPUKernelUnavailable as e:
            if not self.fallback:
                raise CPUKernelUnavailable(
                    f"kernels=cpu: {slot}: {e}. kernels=torch runs without C++ kernels; "
                    f"kernels.{slot}=null runs this one's PyTorch reference; "
                    "kernels.fallback=true does so for every kernel that cannot be built") from e
            log.warning("kernels=%s: %s runs its PyTorch reference: %s", self.name, slot, e)
            return False

    def pack_linear(self, weight: torch.Tensor) -> tuple[Any, torch.Tensor | None]:
        """The first active slot that takes `weight`, and the weight packed for it."""
        for kernel in self.active.values():
            if kernel.takes(weight):
                return kernel, kernel.pack(weight)
        return None, None

    def argmax_rows(self, x: torch.Tensor) -> torch.Tensor:
        if self.argmax_ready:
            return self.argmax(x)
        return super().argmax_rows(x)

    def __repr__(self) -> str:
        slots = ", ".join(f"{s}={k!r}" for s, k in self.gemms.items())
        return f"CPUOps(gemms={{{slots}}}, argmax={self.argmax!r}, fallback={self.fallback})"
