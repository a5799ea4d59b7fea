"""Micro-batching (lab/worker/ubatch.py, lab/worker/ubatch_overlap.py): a step run as two
micro-batches gives the single batch's hidden states, logits and KV cache (fp32, torch backend),
for mixed prefill + decode steps split inside a prefill chunk; run in turn, interleaved at every
all-reduce, and at TP=2 over gloo with the all-reduces in flight while the other computes."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from lab.attention.base import AttentionInputs
from lab.attention.torch_backend import TorchAttentionBackend
from lab.attention.triton_flash import TritonFlashBackend
from lab.attention.triton_mla import TritonMLABackend
from lab.bench.ubatch import (
    Req,
    assign_blocks,
    forward_modes,
    make_cache,
    run_history,
    step_inputs,
)
from lab.config.knobs import EngineKnobs
from lab.distributed.launch import RankPool
from lab.models.loader import load_model
from lab.models.tiny import ensure_tiny_model
from lab.worker.ubatch import (
    UbatchSlice,
    run_model,
    should_split,
    split_batch,
    split_point,
    ubatch_slices,
)
from lab.worker.ubatch_overlap import DualBatchOverlap, TakeTurns
from tests.kv import SMALL_KV
from tests.waits import WAIT_S

BS = 4
# (cached, new) per request: decode, a prefill chunk after 5 cached tokens (the split point,
# token 10 of 20, falls inside it), decode, a new prompt
MIXED = [(9, 1), (5, 12), (3, 1), (0, 6)]
ON = EngineKnobs(enable_dbo=True, dbo_decode_token_threshold=2, dbo_prefill_token_threshold=2)


def _reqs(shape, vocab=512, seed=0) -> list[Req]:
    rng = np.random.default_rng(seed)
    return [Req(rng.integers(0, vocab, c + q).tolist(), c, q) for c, q in shape]


def _inputs(shape) -> AttentionInputs:
    reqs = _reqs(shape)
    tables, _ = assign_blocks(reqs, BS)
    return step_inputs(reqs, tables, BS).attn_inputs


# -- the split, without a model ---------------------------------------------------------------
def test_split_point_inside_a_request_makes_it_two():
    a, b = ubatch_slices([1, 12, 1, 6], split_point(20))
    assert (a, b) == (UbatchSlice(slice(0, 2), slice(0, 10)), UbatchSlice(slice(1, 4), slice(10, 20)))
    a, b = ubatch_slices([4, 3, 1], split_point(8))  # on a boundary: no request in both
    assert (a, b) == (UbatchSlice(slice(0, 1), slice(0, 4)), UbatchSlice(slice(1, 3), slice(4, 8)))


@given(st.lists(st.tuples(st.integers(0, 20), st.integers(1, 9)), min_size=1, max_size=7)
       .filter(lambda s: sum(q for _, q in s) >= 2), st.integers(0, 3))
def test_micro_batches_are_the_step_cut_in_two(shape, pad):
    """Concatenated, A and B give the step's tokens, positions and slots; each micro-batch's
    per-request fields agree with its tokens (positions = num_computed + row in request), and a
    request's tokens never go backwards across the cut."""
    reqs = _reqs(shape)
    tables, _ = assign_blocks(reqs, BS)
    n = sum(q for _, q in shape)
    step = step_inputs(reqs, tables, BS, pad_to=n + pad)
    parts = split_batch(step.input_ids, step.positions, step.attn_inputs)
    for name in ("input_ids", "positions"):
        assert torch.equal(torch.cat([getattr(u, name) for u in parts]), getattr(step, name))
    assert torch.equal(torch.cat([u.attn_inputs.slot_mapping for u in parts]),
                       step.attn_inputs.slot_mapping)
    sizes = [u.attn_inputs.num_actual_tokens for u in parts]
    assert sum(sizes) == n and sizes[0] - sizes[1] in (0, 1)
    for u, sl in zip(parts, ubatch_slices([q for _, q in shape], split_point(n))):
        a = u.attn_inputs
        q, seq = np.array(a.query_lens_cpu), np.array(a.seq_lens_cpu)
        assert q.min() >= 1 and a.num_reqs == len(q) == sl.reqs.stop - sl.reqs.start
        assert a.query_start_loc.tolist() == [0, *np.cumsum(q)]
        assert a.seq_lens.tolist() == seq.tolist()
        assert (a.num_computed_tokens.numpy() == seq - q).all()
        assert torch.equal(a.block_table, step.attn_inputs.block_table[sl.reqs])
        want = np.concatenate([np.arange(c, c + k) for c, k in zip(seq - q, q)])
        assert u.positions[: a.num_actual_tokens].tolist() == want.tolist()


def test_should_split_follows_the_knobs():
    decode, mixed = _inputs([(4, 1)] * 6), _inputs(MIXED)
    assert not should_split(mixed, EngineKnobs())  # off by default
    cfg = EngineKnobs(enable_dbo=True, dbo_decode_token_threshold=6, dbo_prefill_token_threshold=21)
    assert should_split(decode, cfg) and not should_split(mixed, cfg)  # 6 >= 6; 20 < 21
    cfg = EngineKnobs(enable_dbo=True, dbo_decode_token_threshold=7, dbo_prefill_token_threshold=20)
    assert not should_split(decode, cfg) and should_split(mixed, cfg)
    assert not should_split(_inputs([(4, 1)]), ON)  # one token cannot be split


def test_take_turns_alternates_and_lets_the_last_run_on():
    turns, log = TakeTurns(2), []

    def body(i, steps):
        turns.wait(i)
        for k in range(steps):
            log.append((i, k))
            turns.pass_turn(i)
        turns.finish(i)

    threads = [threading.Thread(target=body, args=(i, s)) for i, s in ((0, 2), (1, 4))]
    for t in threads:
        t.start()
    turns.begin()
    for t in threads:
        t.join(timeout=WAIT_S)
    assert log == [(0, 0), (1, 0), (0, 1), (1, 1), (1, 2), (1, 3)]


# -- whole models ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def models():
    """get(name, backend class) -> (model, its backend), loaded once per module."""
    cache = {}

    def get(name, backend_cls=TorchAttentionBackend):
        if (name, backend_cls) not in cache:
            backend = backend_cls()
            model = load_model(ensure_tiny_model(name), backend, torch.float32, "cpu")[0]
            cache[name, backend_cls] = model, backend
        return cache[name, backend_cls]

    return get


def _step_after_history(model, backend, shape, pad_to=None):
    """The step of `shape` over a cache that holds every request's cached tokens."""
    reqs = _reqs(shape, model.config.vocab_size)
    tables, nblocks = assign_blocks(reqs, BS)
    caches = make_cache(model, backend, nblocks, BS, torch.float32, "cpu")
    run_history(model, backend, reqs, tables, BS, caches)
    return step_inputs(reqs, tables, BS, pad_to=pad_to), caches


def _each_mode(model, backend, step, caches, trace=None):
    """Each mode's (hidden, cache after the step), every mode on its own copy of the cache."""
    out = {}
    for mode in ("single", "split", "overlap"):
        mine = [c.clone() for c in caches]
        with torch.no_grad():
            out[mode] = forward_modes(model, backend, step, mine, "cpu", trace)[mode](), mine
    return out


@pytest.mark.parametrize("name,backend_cls", [
    ("tiny_llama", TorchAttentionBackend), ("tiny_deepseek", TorchAttentionBackend),
    ("tiny_llama", TritonFlashBackend), ("tiny_deepseek", TritonMLABackend),  # the interpreter
], ids=["llama-torch", "deepseek-torch", "llama-triton_flash", "deepseek-triton_mla"])
def test_two_micro_batches_equal_the_single_batch(models, name, backend_cls):
    """Hidden states, logits of every request's last token and the KV cache written: in turn
    (split) and interleaved at every all-reduce (overlap) equal the single batch."""
    model, backend = models(name, backend_cls)
    step, caches = _step_after_history(model, backend, MIXED)
    trace = []
    out = _each_mode(model, backend, step, caches, trace)
    ref, ref_cache = out["single"]
    last = step.attn_inputs.query_start_loc[1:].long() - 1
    ref_logits = model.compute_logits(ref[last])
    close = dict(atol=1e-4, rtol=1e-4)  # fp32 sums over other shapes (a wrong split: O(1))
    for mode in ("split", "overlap"):
        hidden, cache = out[mode]
        torch.testing.assert_close(hidden, ref, **close)
        torch.testing.assert_close(model.compute_logits(hidden[last]), ref_logits, **close)
        for c, r in zip(cache, ref_cache):
            torch.testing.assert_close(c, r, **close)
    # interleaved: two all-reduces per layer (o_proj; down_proj or the MoE sum), turns A B A B
    assert trace == [0, 1] * (2 * model.num_layers)


def test_b_before_a_breaks_the_split_request(models):
    """The order matters (what makes the test above able to fail): run B first and the split
    request's tokens in B attend over cache slots A has not written yet."""
    model, backend = models("tiny_llama")
    step, caches = _step_after_history(model, backend, MIXED)
    a, b = split_batch(step.input_ids, step.positions, step.attn_inputs)
    with torch.no_grad():
        ref = model(step.input_ids, step.positions, [c.clone() for c in caches],
                    backend.build_metadata(step.attn_inputs))
        hb = model(b.input_ids, b.positions, caches, backend.build_metadata(b.attn_inputs))
    req1_in_b = slice(0, 3)  # B's first 3 tokens: the rest of request 1 (tokens 10..12)
    assert not torch.allclose(hb[req1_in_b], ref[10:13], atol=1e-3)
    torch.testing.assert_close(hb[3:], ref[13:])  # the requests wholly in B do not care


def test_run_model_splits_per_the_knobs_with_padding(models):
    """The entry point: split (enable_dbo, thresholds met) or not, padding tokens included,
    the rows of the real tokens equal; padding rows stay at the end."""
    model, backend = models("tiny_llama")
    step, caches = _step_after_history(model, backend, MIXED, pad_to=24)
    with torch.no_grad():
        one = run_model(model, backend, step, [c.clone() for c in caches], EngineKnobs())
        two = run_model(model, backend, step, [c.clone() for c in caches], ON)
    assert one.shape == two.shape == (24, model.config.hidden_size)
    torch.testing.assert_close(two[:20], one[:20])


# -- TP=2 over gloo: the all-reduces in flight while the other micro-batch computes -------------
def _tp_modes(state, path: str) -> dict:
    """On each rank: the hidden states of every mode at TP=2, the turns, and run_model's."""
    backend = TorchAttentionBackend()
    model, _ = load_model(path, backend, torch.float32, "cpu", tp=state.tp)
    step, caches = _step_after_history(model, backend, MIXED)
    trace = []
    out = {m: h for m, (h, _) in _each_mode(model, backend, step, caches, trace).items()}
    with torch.no_grad():
        out["run_model"] = run_model(model, backend, step, caches, ON)
    out["trace"], out["layers"] = trace, model.num_layers
    return out


@pytest.fixture(scope="module")
def pool():
    with RankPool(2) as p:
        yield p


@pytest.mark.parametrize("name", ["tiny_llama", "tiny_deepseek"])
def test_tp2_overlap_equals_the_single_batch(pool, name):
    ranks = pool.run(_tp_modes, str(ensure_tiny_model(name)))
    for r in ranks:
        for mode in ("split", "overlap", "run_model"):
            torch.testing.assert_close(r[mode], r["single"])
        # the vocab-parallel embedding's all-reduce, then two per layer; A B A B ...
        assert r["trace"] == [0, 1] * (1 + 2 * r["layers"])
    torch.testing.assert_close(ranks[0]["single"], ranks[1]["single"])  # all-reduced: the same


# -- CUDA ---------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_cuda_overlap_equals_the_single_batch():
    """The comm-stream path (events between the compute and the comm stream) on one GPU: the
    turns are taken, nothing is reduced, the hidden states equal the single batch's."""
    backend = TorchAttentionBackend()
    model, _ = load_model(ensure_tiny_model("tiny_llama"), backend, torch.float32, "cuda")
    reqs = _reqs(MIXED)
    tables, nblocks = assign_blocks(reqs, BS)
    caches = make_cache(model, backend, nblocks, BS, torch.float32, "cuda")
    with torch.no_grad():
        run_history(model, backend, reqs, tables, BS, caches, "cuda")
        step = step_inputs(reqs, tables, BS, "cuda")
        ubatches = split_batch(step.input_ids, step.positions, step.attn_inputs)
        ref = model(step.input_ids, step.positions, [c.clone() for c in caches],
                    backend.build_metadata(step.attn_inputs))
        trace = []
        got = torch.cat(DualBatchOverlap("cuda", trace).run(model, backend, ubatches, caches))
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)  # cuBLAS: other shapes, other sums
    assert trace == [0, 1] * (2 * model.num_layers)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_cuda_tp2_overlap_equals_the_single_batch():
    """NCCL on a comm stream (lab.bench.ubatch.time_modes checks every mode against the single
    batch on each rank before timing)."""
    from lab.bench.ubatch import _time_tp

    run = ("lab.attention.torch_backend.TorchAttentionBackend", "float32", "cuda", 4, 64, 8, 1)
    res = _time_tp(2, str(ensure_tiny_model("tiny_llama")), run, cuda=True)
    assert max(res["max_abs_diff"].values()) < 1e-4


def test_engine_with_micro_batches_gives_the_single_batch_ids(monkeypatch):
    """enable_dbo through the engine: every step of at least 2 tokens (prefill chunks, mixed
    steps, decodes) runs as two micro-batches in the model runner, and the greedy ids equal the
    run without them (chunked prefill splits the prompts over steps)."""
    import lab.worker.ubatch as ub
    from lab import LLM, SamplingParams

    prompts = [[5 + i, 9, 13, 7 * i % 50 + 3, 21, 4][: 3 + i % 4] * (1 + i % 3) for i in range(5)]
    sp = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    kw = dict(max_num_batched_tokens=16, enable_prefix_caching=False, **SMALL_KV)
    ref = [o.outputs[0].token_ids for o in LLM("tiny_llama", **kw).generate(prompts, sp)]
    splits = []
    split_batch = ub.split_batch
    monkeypatch.setattr(ub, "split_batch", lambda *a: splits.append(1) or split_batch(*a))
    llm = LLM("tiny_llama", enable_dbo=True, dbo_decode_token_threshold=2,
              dbo_prefill_token_threshold=2, **kw)
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, sp)]
    assert got == ref and len(splits) >= 6
