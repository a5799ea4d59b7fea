"""lab/kernels is a leaf package: no kernel module imports lab.attention (the fp8-KV scheme and
the references the kernels need live in lab/kernels itself), and the cache dtypes the scheduler
side validates are plain Python."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import lab.kernels

KERNELS = Path(lab.kernels.__file__).parent


def _imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_no_kernel_imports_lab_attention():
    offenders = {
        path.name: sorted(m for m in _imported_modules(path)
                          if m == "lab.attention" or m.startswith("lab.attention."))
        for path in sorted(KERNELS.glob("*.py"))
    }
    assert not {k: v for k, v in offenders.items() if v}


def test_cache_dtypes_import_without_torch():
    code = ("import sys; sys.modules['torch'] = None; "
            "from lab.cache.dtypes import KV_CACHE_DTYPES; print(KV_CACHE_DTYPES)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "('auto', 'fp8')"
