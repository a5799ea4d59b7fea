"""cache/eviction changes which prefixes hit, never the tokens: lfu generates lru's greedy ids
while it keeps a hot prefix that lru evicts."""

import torch

from lab import LLM, SamplingParams
from lab.cache.eviction import LFUEviction, LRUEviction

SP = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
KNOBS = dict(attention="torch", num_gpu_blocks=20, block_size=4, max_model_len=64)


def _waves() -> list[list[list[int]]]:
    """A 12-token hot prefix computed and hit once, one-off prompts that fill the cache after it
    (14 blocks, then 7 of the 19), and the hot prefix again."""
    g = torch.Generator().manual_seed(3)
    rand = lambda n: torch.randint(3, 500, (n,), generator=g).tolist()  # noqa: E731
    hot = rand(12)
    return [[hot + [7]], [hot + [8]], [rand(20), rand(20)], [rand(20)], [hot + [9]]]


def _run(eviction: str):
    llm = LLM("tiny_llama", **KNOBS, **{"cache/eviction": eviction})
    ids, hits = [], []
    for wave in _waves():
        ids.append([o.outputs[0].token_ids for o in llm.generate(wave, SP)])
        hits.append(sum(s.prefix_cache_hits for s in llm.engine.recent_steps) - sum(hits))
    evicted = sum(s.num_evicted_blocks for s in llm.engine.recent_steps)
    return type(llm.engine.scheduler.kv.block_pool.eviction), ids, hits, evicted


def test_lfu_generates_the_greedy_ids_of_lru_and_keeps_the_hot_prefix():
    lru_type, lru_ids, lru_hits, lru_evicted = _run("lru")
    lfu_type, lfu_ids, lfu_hits, lfu_evicted = _run("lfu")
    assert (lru_type, lfu_type) == (LRUEviction, LFUEviction)
    assert lfu_ids == lru_ids
    assert lru_evicted > 0 and lfu_evicted > 0
    assert lru_hits[1] == lfu_hits[1] == 12  # the hot prefix, hit once
    assert lru_hits[-1] == 0  # lru evicted it: freed before the one-off prompts
    assert lfu_hits[-1] == 12  # lfu kept it: hit, where the one-off prompts never were
