"""Build lab's C++ CPU kernels now, into this install's build directory (lab/kernels/cpu_ext.py).

    python -m lab.kernels.build          # every kernel that applies to this machine

scripts/install.sh runs it, so a first engine start only loads them; without it the engine
builds what its options need when it starts (before it reports ready, never in a request).
Exit status 1 when a kernel could not be built (the engine's options then fail or fall back
to their PyTorch references, each as configured).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from types import ModuleType

from lab.kernels import cpu_argmax, cpu_gemm, cpu_paged_decode, cpu_sgemm
from lab.kernels.cpu_ext import CPUKernelUnavailable, extensions_root

KERNELS: tuple[ModuleType, ...] = (cpu_argmax, cpu_sgemm, cpu_gemm, cpu_paged_decode)


def build_all(report: Callable[[str], None] = print) -> list[str]:
    """Build (or load) every kernel of KERNELS whose `applies()` holds here; the names of those
    that could not be built."""
    failed = []
    for module in KERNELS:
        ext = module.EXTENSION
        if not module.applies():
            report(f"  {ext.stem}: does not apply to this machine, skipped")
            continue
        start = time.perf_counter()
        try:
            ext.load()
            report(f"  {ext.stem}: ready ({time.perf_counter() - start:.1f} s)")
        except CPUKernelUnavailable as e:
            failed.append(ext.stem)
            report(f"  {ext.stem}: NOT built: {e}")
    return failed


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    print(f"[lab.kernels.build] C++ CPU kernels into {extensions_root()}")
    failed = build_all()
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
