"""lab.bench.attention_ceiling: decode steps write the KV cache as attention=torch does and
attend to nothing; prefill steps are attention=torch's; the throughput bench runs it through the
engine knob it names."""

import torch

from lab import LLM, SamplingParams
from lab.attention.base import AttentionInputs
from lab.attention.torch_backend import TorchAttentionBackend
from lab.bench.attention_ceiling import KNOB, TARGET, KVWriteOnlyAttention

HKV, GROUP, D, BS = 2, 2, 8, 4


def _step(num_computed: list[int], query_lens: list[int]):
    """(inputs, q, k, v) of one step over a scattered cache: request i holds num_computed[i]
    tokens and adds query_lens[i]; its blocks are 1 + 3i, 2 + 3i, 3 + 3i."""
    tables = [[1 + 3 * i, 2 + 3 * i, 3 + 3 * i] for i in range(len(query_lens))]
    slots = [tables[i][p // BS] * BS + p % BS
             for i, (c, n) in enumerate(zip(num_computed, query_lens)) for p in range(c, c + n)]
    seq_lens = [c + n for c, n in zip(num_computed, query_lens)]
    t = sum(query_lens)
    inputs = AttentionInputs(
        query_start_loc=torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()],
                                     dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        num_computed_tokens=torch.tensor(num_computed, dtype=torch.int32),
        block_table=torch.tensor(tables, dtype=torch.int32),
        slot_mapping=torch.tensor(slots, dtype=torch.long), num_reqs=len(query_lens),
        num_actual_tokens=t, max_query_len=max(query_lens), max_seq_len=max(seq_lens),
        block_size=BS, query_lens_cpu=query_lens, seq_lens_cpu=seq_lens)
    return (inputs, torch.randn(t, HKV * GROUP, D), torch.randn(t, HKV, D),
            torch.randn(t, HKV, D))


def _both(num_computed, query_lens):
    """Each backend's output and cache after the same step on the same cache."""
    torch.manual_seed(0)
    cache = torch.randn(2, 3 * len(query_lens) + 1, BS, HKV, D)
    inputs, q, k, v = _step(num_computed, query_lens)
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
    llm = LLM("tiny_llama", **{KNOB: TARGET})
    assert isinstance(llm.engine.executor.worker.runner.attn_backend, KVWriteOnlyAttention)
    out = llm.generate([[3, 4, 5]], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 3  # as many decode steps as asked
