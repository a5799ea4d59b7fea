"""Issue 30: the simulator runs the real scheduler and cache without the model side — an
`executor=sim` run imports neither lab.worker nor lab.kernels (measured in a fresh interpreter,
so this test process's own imports do not count)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.options import tiny_models

REPO = Path(__file__).resolve().parents[2]  # `python -c` imports the lab of its cwd
CODE = """
import json, sys
from lab import LLM, SamplingParams
found = {}
for name in json.loads(sys.argv[1]):
    LLM(model=name, executor="sim").generate(["Hello"], SamplingParams(max_tokens=4))
    found[name] = sorted(m for m in sys.modules if m.startswith(("lab.worker", "lab.kernels")))
print(json.dumps(found))
"""



def test_executor_sim_imports_neither_the_worker_nor_the_kernels():
    models = tiny_models()
    assert {"tiny_llama", "tiny_qwen3", "tiny_deepseek", "tiny_deepseek_v3"} <= set(models)
    run = subprocess.run([sys.executable, "-c", CODE, json.dumps(models)], capture_output=True,
                         text=True, cwd=REPO)
    assert run.returncode == 0, run.stderr
    found = json.loads(run.stdout.strip().splitlines()[-1])
    assert list(found) == models
    # each list: what that model's run (and the ones before it) imported
    assert all(not imported for imported in found.values()), found
