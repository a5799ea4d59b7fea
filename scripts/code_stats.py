"""The shape of the code, measured: what the architecture's before/after tables quote.

    python scripts/code_stats.py                 # everything, as markdown
    python scripts/code_stats.py --no-runtime    # static parts only (no engine is started)

- lines per package of lab/ (every line of its .py files);
- the longest functions and methods;
- the package-level import cycles among lab's packages (module-level imports only: an import
  inside a function is a deliberate late import and does not make a cycle);
- the files that name a knob (`--knob`, default dbo_decode_token_threshold): the places one
  touches to add a knob like it;
- the lab modules that a `lab serve` frontend process and an `executor=sim` run import (each
  measured in a fresh interpreter).
"""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAB = ROOT / "lab"
sys.path.insert(0, str(ROOT))
from tests.test_layering import cycles, package_graph  # noqa: E402  (the layering rules' home)


def package_of(path: Path) -> str:
    """lab/engine/core.py -> engine; lab/cli.py -> cli (a top-level module is its own unit)."""
    rel = path.relative_to(LAB)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def lines_per_package() -> dict[str, tuple[int, int]]:
    """{package: (files, lines)}, largest first."""
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for path in LAB.rglob("*.py"):
        entry = counts[package_of(path)]
        entry[0] += 1
        entry[1] += len(path.read_text().splitlines())
    return dict(sorted(((k, (f, n)) for k, (f, n) in counts.items()), key=lambda kv: -kv[1][1]))


def longest_functions(n: int) -> list[tuple[int, str]]:
    """The n longest function bodies (lines, 'path:name')."""
    found = []
    for path in LAB.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                found.append((node.end_lineno - node.lineno + 1,
                              f"{path.relative_to(ROOT)}:{node.name}"))
    return sorted(found, reverse=True)[:n]


def files_naming(word: str) -> list[str]:
    out = subprocess.run(["git", "grep", "-l", word, "--", "lab", "run.py"],
                         cwd=ROOT, capture_output=True, text=True)
    return out.stdout.split()


FRONTEND = """
import sys
from lab.cli import serve_config_and_choices
from lab.serve.api_server import build_app
from lab.engine.async_llm import AsyncLLM
cfg, _ = serve_config_and_choices(["model=tiny_llama"])
llm = AsyncLLM.from_config(cfg, [])
build_app(llm, "tiny_llama")
mods = sorted(m for m in sys.modules if m == "lab" or m.startswith("lab."))
llm.shutdown()
print(" ".join(mods))
"""

SIM = """
import sys
from lab import LLM, SamplingParams
llm = LLM(model="tiny_llama", executor="sim")
llm.generate(["Hello"], SamplingParams(max_tokens=4))
print(" ".join(sorted(m for m in sys.modules if m == "lab" or m.startswith("lab."))))
"""


def imported_by(code: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True)
    return out.stdout.split()[-1:] and out.stdout.strip().splitlines()[-1].split()


def summarize_modules(mods: list[str]) -> str:
    """How many lab modules, and which of them are worker / model / kernel / layer / attention /
    compile code (the torch-free shape specs lab.models.*_arch, lab.models.arch, registry,
    source, tiny and lab.attention.spec are named too: they are listed, not hidden)."""
    heavy = [m for m in mods if m.split(".")[1:2] and m.split(".")[1] in (
        "worker", "models", "kernels", "compile", "layers", "attention") and m.count(".") > 1]
    return f"{len(mods)} lab modules; of worker/models/kernels/compile/layers/attention: " + (
        ", ".join(heavy) or "none")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-runtime", action="store_true", help="skip the two import probes")
    parser.add_argument("--knob", default="dbo_decode_token_threshold")
    parser.add_argument("--longest", type=int, default=10)
    args = parser.parse_args()

    print("| package | files | lines |\n|---|---|---|")
    total = 0
    for name, (files, lines) in lines_per_package().items():
        print(f"| {name} | {files} | {lines} |")
        total += lines
    print(f"| (all) | | {total} |\n")
    print("| lines | function |\n|---|---|")
    for lines, name in longest_functions(args.longest):
        print(f"| {lines} | `{name}` |")
    found = cycles(package_graph())
    print(f"\npackage-level import cycles: {len(found)}")
    for comp in found:
        print("  - " + " <-> ".join(comp))
    places = files_naming(args.knob)
    print(f"\nfiles naming {args.knob}: {len(places)} ({', '.join(places)})")
    if not args.no_runtime:
        print(f"\nlab serve frontend: {summarize_modules(imported_by(FRONTEND))}")
        print(f"executor=sim run: {summarize_modules(imported_by(SIM))}")


if __name__ == "__main__":
    main()
