"""Shared test set-up: one CPU thread per process, hypothesis profiles, the `gpu` marker's skip,
the GC's view of the heap."""

import atexit
import gc
import os

# The tests run tiny models and Triton's interpreter: intra-op threads buy nothing there, and on
# a busy 2-core machine their spin-waiting doubled the suite's CPU time. Set before torch loads so
# the OpenMP pool and every subprocess (run.py, the sm_90 compiles) inherit it; export
# OMP_NUM_THREADS to override.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

from lab.kernels import use_interpreter_without_cuda  # noqa: E402
from tests.procs import short_tmp_dir  # noqa: E402
from tests.triton_interpreter import patch_the_language_once_per_launch  # noqa: E402

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# Triton kernels run in its interpreter without CUDA: switched on before any test module imports
# a kernel module (an engine run switches it on itself, lab/kernels/__init__.py)
use_interpreter_without_cuda()

patch_the_language_once_per_launch()

# `ci` (what scripts/test.sh runs) is sized to minutes on a 2-core CPU and derandomized, so a
# landing never depends on the draw; `dev` (plain pytest) draws new examples every run; `deep` is
# for long property runs by hand:
#   HYPOTHESIS_PROFILE=deep python -m pytest tests -m "not gpu"
settings.register_profile(
    "ci", max_examples=40, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", max_examples=60, deadline=None)
settings.register_profile(
    "deep", max_examples=2000, deadline=None, suppress_health_check=list(HealthCheck)
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_collection_finish(session):
    """What the collection imported (torch, transformers, lab, the test modules: ~600k objects
    the cyclic GC tracks) lives as long as the process: moved out of the GC's sight once, so the
    suite's automatic full collections walk only what the tests make. An engine's shutdown
    would hand them back (lab.engine.core.unfreeze_gc_heap): the fixture below stops that.

    They are handed back at the interpreter's exit, as lab.engine.core's freeze does (Triton's
    nanobind counts its live objects then and reported frozen ones as leaked: `nanobind: leaked
    514 functions!`), not at pytest_unconfigure: pytest's clean-up after it runs five full
    collections (for unraisable exceptions), which would each walk them again."""
    gc.collect()
    gc.freeze()
    atexit.register(gc.unfreeze)


@pytest.fixture
def short_tmp():
    """tests/procs.py short_tmp_dir: a child process's TMPDIR."""
    with short_tmp_dir() as path:
        yield path


@pytest.fixture(autouse=True)
def _no_gc_freeze_in_process(request, monkeypatch):
    """In-process engines skip build_core's freeze_gc_heap (its full collection walks every
    object torch, transformers and the earlier tests left: ~0.15 s a start, ~400 starts in the
    suite) and keep the collection-time freeze above at their shutdown. Core processes
    (engine_client=mp, lab serve) still freeze their own heaps, and tests marked `gc_freeze`
    (tests/engine/test_gc_freeze.py) check the in-process freeze, then freeze again."""
    marked = "gc_freeze" in request.keywords
    if not marked:
        monkeypatch.setattr("lab.engine.builder.freeze_gc_heap", lambda: None)
        monkeypatch.setattr("lab.engine.core.unfreeze_gc_heap", lambda: None)
    yield
    if marked:  # its engines unfroze the heap at their shutdown
        gc.collect()
        gc.freeze()
