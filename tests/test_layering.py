"""The layering of lab's packages, read from the source (module-level imports; an import inside a
function is a deliberate late import and does not count):

- no package-level import cycle inside lab/ (package A imports B and B imports A, or longer);
- lab.core is the torch-free vocabulary: it imports no torch and no other lab package;
- the scheduler, the KV cache and the config package import no torch;
- lab.kernels is a leaf: it imports no other lab package, not even inside a function (the fp8-KV
  scheme and the references the kernels need live in lab/kernels itself);
- the engine's processes: a `lab serve` frontend (engine_client=async_mp) imports no worker, model,
  kernel, layer, attention or compile module (checked in a fresh interpreter).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from tests.kv import SMALL_KV

LAB = Path(__file__).resolve().parents[1] / "lab"


def package_of(path: Path) -> str:
    rel = path.relative_to(LAB)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def imports(path: Path, nested: bool = False) -> set[str]:
    """The modules a file imports at module level (`nested`: inside functions too)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in (ast.walk(tree) if nested else tree.body):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def imports_by_package() -> dict[str, dict[str, set[str]]]:
    """{package: {module path: module-level imports}}."""
    found: dict[str, dict[str, set[str]]] = defaultdict(dict)
    for path in sorted(LAB.rglob("*.py")):
        found[package_of(path)][str(path.relative_to(LAB))] = imports(path)
    return found


IMPORTS = imports_by_package()


def lab_packages(imports: set[str]) -> set[str]:
    return {m.split(".")[1] for m in imports if m.startswith("lab.") and m.count(".") >= 1}


def package_graph() -> dict[str, set[str]]:
    return {pkg: set().union(*(lab_packages(i) for i in mods.values())) - {pkg}
            for pkg, mods in IMPORTS.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one package."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while (w := stack.pop()) != v:
                comp.append(w)
            if comp:
                found.append(sorted([v, *comp]))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_package_level_import_cycle():
    assert cycles(package_graph()) == []


def offenders(package: str, bad) -> dict[str, list[str]]:
    return {mod: sorted(m for m in imports if bad(m))
            for mod, imports in IMPORTS[package].items() if any(bad(m) for m in imports)}


def _torch(m: str) -> bool:
    return m == "torch" or m.startswith("torch.")


def test_core_is_torch_free_and_imports_only_itself():
    assert offenders("core", lambda m: _torch(m) or (m.startswith("lab.")
                                                      and not m.startswith("lab.core"))) == {}


@pytest.mark.parametrize("package", ["scheduler", "cache", "config", "frontend"])
def test_these_packages_import_no_torch(package):
    assert offenders(package, _torch) == {}


def test_kernels_are_a_leaf():
    outside = {path.name: sorted(m for m in imports(path, nested=True)
                                 if m.startswith("lab.") and not m.startswith("lab.kernels"))
               for path in sorted((LAB / "kernels").glob("*.py"))}
    assert {k: v for k, v in outside.items() if v} == {}


def test_the_cache_dtypes_the_scheduler_side_checks_import_without_torch():
    code = ("import sys; sys.modules['torch'] = None; "
            "from lab.cache.dtypes import KV_CACHE_DTYPES; print(KV_CACHE_DTYPES)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "('auto', 'fp8')"


HEAVY = ("lab.worker", "lab.models", "lab.kernels", "lab.layers", "lab.attention", "lab.compile")

FRONTEND = """
import sys
from lab.cli import serve_config_and_choices
from lab.engine.async_llm import AsyncLLM
from lab.serve.api_server import build_app
cfg, _ = serve_config_and_choices(["model=tiny_llama", *SETTINGS])
llm = AsyncLLM.from_config(cfg, [])
try:
    build_app(llm, "tiny_llama")
    print(sorted(m for m in sys.modules if m.startswith(HEAVY)))
finally:
    llm.shutdown()
""".replace("HEAVY", repr(HEAVY)).replace(
    "SETTINGS", repr([f"{k}={v}" for k, v in SMALL_KV.items()]))


def test_a_serve_frontend_imports_no_worker_model_or_kernel_code():
    """The frontend process (HTTP, tokenizing, detokenizing) of `lab serve` with its engine core
    in another process: the model's code is the core process's alone."""
    out = subprocess.run([sys.executable, "-c", FRONTEND], capture_output=True, text=True,
                         timeout=300, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


PRELOAD_PROBES = """
import importlib
import torch
calls = []
for name in ("is_available", "device_count", "init"):
    real = getattr(torch.cuda, name)
    setattr(torch.cuda, name, lambda *a, _n=name, _f=real, **k: calls.append(_n) or _f(*a, **k))
from lab.distributed.launch import PRELOAD
for module in PRELOAD:
    importlib.import_module(module)
print(calls, torch.cuda.is_initialized())
"""


def test_the_fork_servers_preload_touches_no_cuda():
    """Engine-core processes and ranks are forks of a fork server that imports PRELOAD: an
    import that asked for CUDA there (a device count initializes the driver) would leave every
    fork unable to use it, as a CUDA parent's fork is."""
    out = subprocess.run([sys.executable, "-c", PRELOAD_PROBES], capture_output=True, text=True,
                         timeout=300, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[] False"
