"""compile=null (auto, the default; lab/compile/policy.py): compiled on a CPU for a model of at
least AUTO_COMPILE_MIN_PARAMS parameters on one rank without enforce_eager where a C++ compiler
is found, else eager, each refusal saying why; true / false as given; the worker asks the policy
and the summary's header says whether the forward is compiled."""

import pytest
import torch

from lab import LLM
from lab.compile import policy
from lab.compile.policy import AUTO_COMPILE_MIN_PARAMS, should_compile
from lab.engine.replay import run_setup
from tests.kv import SMALL_KV

CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)
BIG = AUTO_COMPILE_MIN_PARAMS


@pytest.fixture
def cxx(monkeypatch):
    monkeypatch.setattr(policy, "has_cxx", lambda: True)


def test_auto_compiles_a_large_model_on_one_cpu_rank(cxx):
    wanted, why = should_compile(None, CPU, BIG, 1, False)
    assert wanted and "compile=false runs eagerly" in why


@pytest.mark.parametrize(("device", "params", "ranks", "eager", "reason"), [
    (CUDA, BIG, 1, False, "not a CPU"),
    (CPU, BIG, 2, False, "tensor_parallel_size=2"),
    (CPU, BIG, 1, True, "enforce_eager=true"),
    (CPU, BIG - 1, 1, False, "under 10 M"),
])
def test_auto_runs_eagerly_and_says_why(cxx, device, params, ranks, eager, reason):
    wanted, why = should_compile(None, device, params, ranks, eager)
    assert not wanted and reason in why


def test_auto_without_a_cxx_runs_eagerly(monkeypatch):
    monkeypatch.setattr(policy.shutil, "which", lambda name: None)
    wanted, why = should_compile(None, CPU, BIG, 1, False)
    assert not wanted and "no C++ compiler" in why


def test_a_given_value_wins(cxx):
    assert should_compile(True, CPU, 10, 1, False)[0]
    assert not should_compile(False, CPU, BIG, 1, False)[0]


def test_the_worker_asks_the_policy(monkeypatch, cxx):
    """With the threshold at 0 the default tiny engine is compiled (compile_model stubbed: the
    compile itself is tests/compile/test_compile.py's); at the real one it runs eagerly."""
    from lab.worker import worker

    llm = LLM("tiny_llama", dtype="float32", **SMALL_KV)
    assert llm.engine.executor.worker.compiled is None
    assert run_setup(llm.engine)["compile"] == "off"
    calls = []
    monkeypatch.setattr(policy, "AUTO_COMPILE_MIN_PARAMS", 0)
    monkeypatch.setattr(worker, "compile_model", lambda *a, **k: calls.append(a) or None)
    LLM("tiny_llama", dtype="float32", **SMALL_KV)
    assert len(calls) == 1
    calls.clear()
    LLM("tiny_llama", dtype="float32", compile=False, **SMALL_KV)
    assert not calls
