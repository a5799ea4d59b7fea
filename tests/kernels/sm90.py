"""Compile Triton kernels for sm_90 (Hopper) on a machine without a GPU.

A kernel test writes the body of a script that calls `build(fn, types, consts, aligned, **opts)`
for its kernels and prints "ok"; `compile_for_sm90(body)` runs PRELUDE + body in a fresh
interpreter with TRITON_INTERPRET=0 (compiled mode), skips when the triton wheel lacks the NVIDIA
backend or ptxas, and returns the finished process (stdout carries whatever the body printed).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PRELUDE = textwrap.dedent("""
    import triton
    from triton.backends.compiler import GPUTarget

    def build(fn, types, consts, aligned=(), **opts):
        sig = {n: types.get(n, "constexpr" if n in consts else "i32") for n in fn.arg_names}
        attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names) if n in aligned}
        src = triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
        return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)
""")


def compile_for_sm90(body: str, **env_vars: str) -> subprocess.CompletedProcess:
    """Run PRELUDE + body for sm_90 (with extra environment variables); assert it exited cleanly
    and printed "ok"."""
    pytest.importorskip("triton.backends.nvidia")
    env = {**os.environ, "TRITON_INTERPRET": "0", **env_vars}
    script = PRELUDE + textwrap.dedent(body)
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                          timeout=300, cwd=Path(__file__).resolve().parents[2])
    if re.search(r"(ptxas|cuobjdump).*(not found|No such file)", proc.stderr):
        pytest.skip("no ptxas/cuobjdump in this triton install")
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-3000:]
    return proc
