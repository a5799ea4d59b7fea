"""lab's benchmarks, each a module run as `lab bench NAME [args]` (= `python -m lab.bench.NAME`);
`names()` lists them. Comparisons that run in a peer engine's venv and test oracles live in the
repository's benchmarks/ folder, not here (lab/bench/peer.py finds them)."""

from __future__ import annotations

import pkgutil
from pathlib import Path

_MAIN_GUARD = 'if __name__ == "__main__":'


def names() -> tuple[str, ...]:
    """The runnable benches, sorted: this package's modules that have a `__main__` block (read
    from their source, none imported; helpers such as workload or peer have none)."""
    here = Path(__file__).parent
    return tuple(sorted(m.name for m in pkgutil.iter_modules([str(here)])
                        if _MAIN_GUARD in (here / f"{m.name}.py").read_text()))
