"""lab.bench.attention_ceiling: decode steps write the KV cache as attention=torch does and
attend to nothing; prefill steps are attention=torch's; the throughput bench runs it through the
engine knob it names."""

import torch

from lab import LLM, SamplingParams
from lab.attention.torch_backend import TorchAttentionBackend
from lab.bench.attention_ceiling import KNOBS, KVWriteOnlyAttention
from tests.attention.paged_steps import paged_step

D = 8


def _both(num_computed, query_lens):
    """Each backend's output and cache after the same step on the same cache."""
    inputs, q, k, v, cache = paged_step(num_computed, query_lens, d=D, padding=False)
    results = []
    for backend in (TorchAttentionBackend(), KVWriteOnlyAttention()):
        mine = cache.clone()
        out = backend.forward(0, q, k, v, mine, backend.build_metadata(inputs), D ** -0.5)
        results.append((out, mine))
    return results


def test_decode_writes_the_cache_and_attends_to_nothing():
    (ref_out, ref_cache), (out, cache) = _both([5, 9, 2], [1, 1, 1])
    assert torch.equal(cache, ref_cache)  # the step's K/V rows written where attention=torch does
    assert out.shape == ref_out.shape and not out.any() and ref_out.any()


def test_prefill_and_mixed_steps_attend_as_the_torch_backend():
    for computed, qlens in (([0, 0], [6, 3]), ([4, 0], [1, 5])):
        (ref_out, ref_cache), (out, cache) = _both(computed, qlens)
        assert torch.equal(cache, ref_cache)
        torch.testing.assert_close(out, ref_out)


def test_the_knob_puts_it_in_the_engine():
    llm = LLM("tiny_llama", **KNOBS)
    assert isinstance(llm.engine.executor.worker.runner.attn_backend, KVWriteOnlyAttention)
    out = llm.generate([[3, 4, 5]], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 3  # as many decode steps as asked
