"""Building lab's C++ CPU kernels (torch's cpp_extension), one place for all of them.

The CPU has no compiled Triton here (only the interpreter), so the few CPU kernels lab has are
C++ (`lab/kernels/cpu_*.cpp`), each beside its PyTorch reference like every Triton kernel.
`CPUExtension(stem)` builds `<stem>.cpp` at first use (~15 s on 2 cores) and caches it on
disk (TORCH_EXTENSIONS_DIR) and in the process:

- flags: `-O3 -march=native` (this CPU's instructions: AVX-512, AMX where it has them);
  `-fopenmp` makes `at::parallel_for` run on torch's OpenMP pool (without it the header-only
  loop runs serially; the extension's libgomp is torch's, one runtime per process);
  `-ffast-math` lets fp32 reductions and exp vectorize (glibc's libmvec: `-lmvec`); an
  extension may add flags after these (`extra_cflags`: cpu_sgemm undoes -ffast-math, as its
  kernel's order of adds is its contract).
- name: `lab_<stem>_<hash>`, the hash over the source, the flags, torch's version and this
  CPU's flags, so a changed source or another machine builds its own copy instead of loading a
  binary made for other instructions.
- failure: no compiler, no ninja, no libmvec... raise `CPUKernelUnavailable`; the callers fall
  back to their torch path (saying so once).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import platform
from pathlib import Path

log = logging.getLogger(__name__)

CFLAGS = ("-O3", "-march=native", "-fopenmp", "-ffast-math")
LDFLAGS = ("-fopenmp", "-lmvec")  # OpenMP (torch's libgomp at run time), glibc's vector math


class CPUKernelUnavailable(RuntimeError):
    """A C++ CPU kernel could not be built or loaded here (no compiler, no glibc libmvec, ...)."""


def cpu_flags() -> str:
    """This CPU's feature flags (/proc/cpuinfo), or the processor name where there is none."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor()


class CPUExtension:
    """The extension built from lab/kernels/<stem>.cpp (module docstring)."""

    def __init__(self, stem: str, extra_cflags: tuple[str, ...] = ()) -> None:
        self.stem = stem
        self.cflags = CFLAGS + extra_cflags  # later flags win: ("-fno-fast-math",) undoes one
        self.source = Path(__file__).with_name(f"{stem}.cpp")

    def name(self) -> str:
        """lab_<stem>_<hash of source, flags, torch version and the CPU's flags>."""
        import torch

        key = "\n".join([self.source.read_text(), *self.cflags, *LDFLAGS, torch.__version__,
                         cpu_flags()])
        return f"lab_{self.stem}_{hashlib.sha256(key.encode()).hexdigest()[:12]}"

    @functools.cache  # noqa: B019 - one per module-level instance, never freed
    def load(self):
        """The compiled extension, built on first use (then cached on disk and here)."""
        return self.build()

    @functools.cache  # noqa: B019
    def available(self) -> bool:
        """Whether it is built (or can be, now) here; the reason it cannot is logged once."""
        try:
            self.load()
            return True
        except CPUKernelUnavailable as e:
            log.info("%s; its torch path runs instead", e)
            return False

    def build(self):
        """Build (or load from the disk cache) the extension; CPUKernelUnavailable when it
        cannot be built here."""
        try:
            from torch.utils.cpp_extension import load as cpp_load

            # copies: cpp_extension appends torch's libraries to the lists it is given, which
            # changed the next extension's name (and so built a second copy of it)
            return cpp_load(self.name(), [str(self.source)], extra_cflags=list(self.cflags),
                            extra_ldflags=list(LDFLAGS), verbose=False)
        except Exception as e:  # no compiler / ninja: OSError, RuntimeError, CalledProcessError
            raise CPUKernelUnavailable(
                f"the CPU kernel {self.source.name} could not be built: {e}") from e


class PackedGemm:
    """The Python side of a C++ GEMM on a weight packed once, shared by cpu_gemm (bf16 on AMX
    tiles) and cpu_sgemm (fp32: its ordered AVX-512 kernel or MKL's packed sgemm). The
    extension exports `pack(W)` and defines the dispatcher op
    `lab_cpu::<op>(x [M, K], packed, weight [N, K], bias) -> [M, N]`;
    here: whether it runs on this machine (`ready`, checked once, then the op's fake
    implementation is registered so torch.compile keeps it opaque), packing, and the call with
    any leading dims."""

    def __init__(self, extension: CPUExtension, op: str, supports, ready) -> None:
        self.extension, self.op = extension, op
        self.supports = supports  # weight -> whether the kernel takes it
        self.ready = ready  # () -> whether the kernel is built and may run here

    @functools.cache  # noqa: B019
    def available(self) -> bool:
        if not self.ready():
            return False
        import torch

        torch.library.register_fake(f"lab_cpu::{self.op}")(_packed_gemm_fake)
        return True

    def try_pack(self, weight):
        """The packed weight where the kernel takes it on this machine, else None."""
        if not self.supports(weight) or not self.available():
            return None
        return self.pack(weight)

    def pack(self, weight):
        return self.extension.load().pack(weight.detach())

    def gemm(self, x, packed, weight, bias=None):
        """y [..., N] = x [..., K] W^T (+ bias) through `packed` (= pack(weight))."""
        import torch

        op = getattr(torch.ops.lab_cpu, self.op)
        return op(x.reshape(-1, x.shape[-1]), packed, weight, bias).view(*x.shape[:-1],
                                                                        weight.shape[0])


def _packed_gemm_fake(x, packed, weight, bias):
    return x.new_empty(x.shape[0], weight.shape[0])
