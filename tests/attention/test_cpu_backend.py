"""attention=cpu: decode steps through the C++ kernel equal attention=torch (output and cache),
with a layer's sliding window, sinks and soft cap too; fresh prefills (with a window too) equal
it; other steps are attention=torch's; the kernel is loaded by setup (before the engine is
ready), never by a step; without the kernel it says so once and runs the torch path; an engine
with it generates attention=torch's greedy tokens (fp32), padded decode included."""

import logging

import pytest
import torch

from lab import LLM, SamplingParams
from lab.attention.cpu_backend import CPUAttentionBackend
from lab.attention.torch_backend import TorchAttentionBackend
from lab.kernels import cpu_paged_decode as kernel
from tests.attention.paged_steps import paged_step, run_features, sink_logits
from tests.kv import SMALL_KV

D = 8


@pytest.fixture(scope="module")
def has_kernel() -> bool:
    try:
        kernel.load()
        return True
    except kernel.CPUKernelUnavailable:
        return False


def _backend() -> CPUAttentionBackend:
    backend = CPUAttentionBackend()
    backend.setup(torch.device("cpu"))
    return backend


def _step(num_computed: list[int], query_lens: list[int], dtype=torch.float32):
    return paged_step(num_computed, query_lens, d=D, dtype=dtype)


def _run(backend, step):
    inputs, q, k, v, cache = step
    cache = cache.clone()
    return backend.forward(0, q, k, v, cache, backend.build_metadata(inputs), D ** -0.5), cache


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_equals_the_torch_backend(has_kernel, dtype):
    step = _step([5, 9, 2], [1, 1, 1], dtype)
    backend = _backend()
    out, cache = _run(backend, step)
    want, want_cache = _run(TorchAttentionBackend(), step)
    assert backend.kernel_ok is has_kernel
    assert torch.equal(cache, want_cache)
    tol = {} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    torch.testing.assert_close(out, want, **tol)


def test_a_decode_step_never_builds_the_kernel(monkeypatch):
    """Without setup (which the Worker runs before the engine is ready) a decode step refuses to
    run instead of building the kernel inside a request; a CUDA device builds nothing."""
    monkeypatch.setattr(kernel, "load", lambda: pytest.fail("built inside a step"))
    with pytest.raises(RuntimeError, match=r"setup\(device\) was not called"):
        _run(CPUAttentionBackend(), _step([5, 9], [1, 1]))
    backend = CPUAttentionBackend()
    backend.setup(torch.device("cuda"))
    assert backend.kernel_ok is False


def test_mixed_steps_and_prefills_after_a_cache_hit_are_the_torch_backends():
    for computed, qlens in (([4, 0], [1, 5]), ([8, 3], [4, 2])):
        step = _step(computed, qlens)
        (out, cache), (want, want_cache) = _run(_backend(), step), _run(
            TorchAttentionBackend(), step)
        assert torch.equal(out, want) and torch.equal(cache, want_cache)


@pytest.mark.parametrize("qlens", [[6, 3, 9], [5, 5], [7]])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fresh_prefills_attend_over_their_own_rows_as_the_torch_backend(qlens, dtype):
    """Nothing cached before the step (one length: one batched call; lengths differ: one call
    per request): the same cache and, to rounding, the same output as attention=torch's
    padded, masked SDPA over the gathered cache; no torch metadata is built."""
    step = _step([0] * len(qlens), qlens, dtype)
    backend = _backend()
    inputs, q, k, v, cache = step
    md = backend.build_metadata(inputs)
    cache = cache.clone()
    out = backend.forward(0, q, k, v, cache, md, D ** -0.5)
    assert "torch" not in vars(md)
    want, want_cache = _run(TorchAttentionBackend(), step)
    assert torch.equal(cache, want_cache)
    tol = {"atol": 1e-6, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    torch.testing.assert_close(out, want, **tol)


def test_without_the_kernel_it_warns_once_and_runs_the_torch_path(monkeypatch, caplog):
    def unavailable():
        raise kernel.CPUKernelUnavailable("no C++ compiler")

    monkeypatch.setattr(kernel, "load", unavailable)
    step = _step([5, 9], [1, 1])
    with caplog.at_level(logging.WARNING, logger="lab.attention.cpu_backend"):
        backend = _backend()
        outs = [_run(backend, step) for _ in range(2)]
    assert [r.message for r in caplog.records] == [
        "attention=cpu runs attention=torch's decode path: no C++ compiler"]
    want, want_cache = _run(TorchAttentionBackend(), step)
    for out, cache in outs:
        assert torch.equal(out, want) and torch.equal(cache, want_cache)


@pytest.mark.parametrize("padded", [False, True])
def test_an_engine_with_it_generates_the_torch_backends_tokens(has_kernel, padded):
    knobs = {"cudagraph_capture_sizes": [4, 8]} if padded else {}  # 3 requests padded to 4
    knobs |= SMALL_KV
    prompts = [[3, 4, 5, 6, 7], list(range(10, 40)), [8]]
    sp = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    ids = {}
    for attention in ("torch", "cpu"):
        llm = LLM("tiny_llama", attention=attention, **knobs)
        ids[attention] = [o.outputs[0].token_ids for o in llm.generate(prompts, sp)]
    runner = llm.engine.executor.worker.runner
    assert runner.attn_backend.kernel_ok is has_kernel
    assert ids["cpu"] == ids["torch"]


def test_decode_metadata_is_deferred_until_a_layer_needs_it(has_kernel):
    """A pure-decode step builds no attention=torch metadata unless a layer the kernel does not
    take asks for it (here fp16, which the kernel does not take): then it equals the torch
    backend's."""
    backend = _backend()
    inputs, q, k, v, cache = _step([5, 9, 2], [1, 1, 1])
    md = backend.build_metadata(inputs)
    backend.forward(0, q, k, v, cache.clone(), md, D ** -0.5)
    assert ("torch" in vars(md)) is not has_kernel
    step16 = _step([5, 9, 2], [1, 1, 1], torch.float16)
    (out, cache16), (want, want_cache) = _run(backend, step16), _run(TorchAttentionBackend(),
                                                                      step16)
    assert torch.equal(out, want) and torch.equal(cache16, want_cache)


def test_an_mla_model_runs_the_torch_path_with_it():
    prompts = [[3, 4, 5, 6, 7], [8, 9]]
    sp = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    ids = {attention: [o.outputs[0].token_ids for o in LLM(
        "tiny_deepseek", attention=attention, **SMALL_KV).generate(prompts, sp)]
        for attention in ("torch", "cpu")}
    assert ids["cpu"] == ids["torch"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("window", "sinks", "softcap"), [
    (1, False, None), (4, False, None), (50, False, None), (None, True, None), (None, False, 0.6),
    (5, True, 0.6)])
def test_decode_features_equal_the_torch_backend(has_kernel, dtype, window, sinks, softcap):
    """The decode kernel with a window (a query seeing itself only, fewer keys than the
    requests hold, more than any), sinks, a soft cap and all three."""
    step = _step([5, 11, 2], [1, 1, 1], dtype)
    sinks = sink_logits(step[1].shape[1]) if sinks else None
    backend = _backend()
    out, cache = run_features(backend, step, window, sinks, softcap)
    assert backend.kernel_ok is has_kernel
    want, want_cache = run_features(TorchAttentionBackend(), step, window, sinks, softcap)
    assert torch.equal(cache, want_cache)
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    torch.testing.assert_close(out, want, **tol)


@pytest.mark.parametrize("qlens", [[6, 3, 9], [7, 7]])
@pytest.mark.parametrize(("window", "sinks", "softcap"), [
    (1, False, None), (3, False, None), (7, False, None), (None, True, None),
    (4, True, 0.6)])
def test_fresh_prefill_features_equal_the_torch_backend(qlens, window, sinks, softcap):
    """A window (shorter than, equal to the prompts) on the fresh-prefill path (its SDPA with
    the window's band, no torch metadata); sinks or a soft cap: attention=torch's path."""
    step = _step([0] * len(qlens), qlens)
    sinks = sink_logits(step[1].shape[1]) if sinks else None
    backend = _backend()
    inputs, q, k, v, cache = step
    md = backend.build_metadata(inputs)
    kw = {n: x for n, x in (("sliding_window", window), ("sinks", sinks), ("softcap", softcap))
          if x is not None}
    cache = cache.clone()
    out = backend.forward(0, q, k, v, cache, md, D ** -0.5, **kw)
    assert ("torch" in vars(md)) == (sinks is not None or softcap is not None)
    want, want_cache = run_features(TorchAttentionBackend(), step, window, sinks, softcap)
    assert torch.equal(cache, want_cache)
    torch.testing.assert_close(out, want, atol=1e-6, rtol=1e-5)
