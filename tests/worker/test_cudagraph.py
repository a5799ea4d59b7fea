"""The padded decode path (lab/worker/cudagraph.py): which steps pad, that padding changes no
token, logprob or real KV slot, the knobs, the backends' declarations, and (gpu) CUDA-graph
capture and replay against eager."""

from __future__ import annotations

import pytest
import torch

from lab import LLM, SamplingParams
from lab.attention.base import CudaGraphSupport
from lab.attention.torch_backend import TorchAttentionBackend
from lab.attention.triton_flash import TritonFlashBackend
from lab.attention.triton_mla import TritonMLABackend
from lab.config.compose import compose_config
from lab.config.validate import validate_config
from lab.core.step import CachedRequestData, NewRequestData, SchedulerOutput
from lab.engine.builder import worker_config
from lab.worker import model_runner
from lab.worker.cudagraph import PaddedDecode, default_capture_sizes, resolve_capture_sizes
from lab.worker.worker import Worker
from tests.kv import SMALL_KV

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_capture_sizes_of_the_knobs():
    assert resolve_capture_sizes(None, False, CUDA, 256, 2048) == tuple(default_capture_sizes(256))
    assert default_capture_sizes(512)[:5] == [1, 2, 4, 8, 16] and default_capture_sizes(512)[-1] \
        == 512 and 264 not in default_capture_sizes(512) and 272 in default_capture_sizes(512)
    assert resolve_capture_sizes(None, False, CPU, 256, 2048) == ()  # no graphs on a CPU
    assert resolve_capture_sizes([8, 2, 2, 64], False, CPU, 16, 2048) == (2, 8)  # <= max seqs
    assert resolve_capture_sizes([8, 2], True, CUDA, 16, 2048) == ()  # enforce_eager
    assert resolve_capture_sizes(None, False, CUDA, 256, 12)[-1] == 8  # <= tokens per step


@pytest.mark.parametrize(("override", "allowed"), [
    ("cudagraph_capture_sizes=[0,4]", "list of integers >= 1"),
    ("cudagraph_capture_sizes=[]", "list of integers >= 1"),
    ("cudagraph_capture_sizes=8", "list of integers >= 1"),
    ("enforce_eager=maybe", "true or false"),
])
def test_bad_knobs_are_refused(override, allowed):
    with pytest.raises(ValueError, match=f"^{override.split('=')[0]}=.*{allowed}"):
        validate_config(compose_config([override]))
    validate_config(compose_config(["cudagraph_capture_sizes=[1,2,4]", "enforce_eager=true"]))


def test_backends_declare_what_they_support():
    assert TorchAttentionBackend().cudagraph_support(CPU) is CudaGraphSupport.UNIFORM_DECODE
    assert TorchAttentionBackend().cudagraph_support(CUDA) is CudaGraphSupport.NEVER
    for backend in (TritonFlashBackend(), TritonMLABackend()):
        assert backend.cudagraph_support(CUDA) is CudaGraphSupport.UNIFORM_DECODE


class PaddedSpy:
    """Records (real requests, padded size) of every padded step and the new tokens per
    request of every eager one."""

    def __init__(self, monkeypatch):
        self.steps: list[tuple[int, int]] = []
        self.eager: list[list[int]] = []
        run, prepare = PaddedDecode.run, model_runner.prepare_inputs

        def spy(padded, batch, kv_caches):
            self.steps.append((len(batch.sampled), batch.padded_size))
            return run(padded, batch, kv_caches)

        def eager(rows, *args):
            self.eager.append(rows.num_scheduled.tolist())
            return prepare(rows, *args)

        monkeypatch.setattr(PaddedDecode, "run", spy)
        monkeypatch.setattr(model_runner, "prepare_inputs", eager)


PROMPTS = [[5, 9, 31, 2, 7], [11, 4], [300, 301, 302, 303, 304, 305, 306, 307, 308], [42],
           [8, 8, 8, 8, 8, 8, 8], [77, 3, 19]]
PARAMS = [SamplingParams(temperature=0, max_tokens=n) for n in (9, 3, 6, 12)] + [
    SamplingParams(temperature=0.9, seed=4, top_k=20, max_tokens=10, logprobs=3,
                   presence_penalty=0.5, prompt_logprobs=2),
    SamplingParams(temperature=1.1, seed=9, top_p=0.8, min_p=0.05, max_tokens=7,
                   repetition_penalty=1.2, min_tokens=4, logit_bias={7: 3.0})]


def generate(**knobs):
    """Token ids, and (token, rank, logprob) of every sampled and prompt logprob."""
    llm = LLM("tiny_llama", dtype="float32", device="cpu", max_num_batched_tokens=16,
              block_size=4, **SMALL_KV, **knobs)
    try:
        outs = llm.generate(PROMPTS, PARAMS)
    finally:
        llm.engine.shutdown()
    flat = [(t, lp.rank, lp.logprob) for o in outs
            for pos in (o.outputs[0].logprobs or []) + (o.prompt_logprobs or [])
            for t, lp in (pos or {}).items()]
    return [o.outputs[0].token_ids for o in outs], flat


def assert_same_outputs(got, want):
    """Equal token ids; logprobs equal up to fp32 rounding (padding changes GEMM shapes)."""
    assert got[0] == want[0]
    assert [(t, r) for t, r, _ in got[1]] == [(t, r) for t, r, _ in want[1]] and want[1]
    assert [v for *_, v in got[1]] == pytest.approx([v for *_, v in want[1]], abs=1e-4)


def test_padded_decode_gives_the_eager_tokens_and_logprobs(monkeypatch):
    """Sizes [2, 4]: decode steps of 1..4 requests pad (to 2 or 4), larger decode steps and
    steps with prefill tokens run eagerly; token ids (greedy, seeded, penalties, biases),
    logprobs and prompt logprobs are those of enforce_eager=true."""
    want = generate(enforce_eager=True)
    spy = PaddedSpy(monkeypatch)
    assert_same_outputs(generate(cudagraph_capture_sizes=[2, 4]), want)
    assert {size for _, size in spy.steps} == {2, 4}
    assert any(b < size for b, size in spy.steps)  # padding rows ran
    assert all(b <= size for b, size in spy.steps)
    assert any(len(n) > 4 and set(n) == {1} for n in spy.eager)  # decodes above the sizes
    assert any(1 in n and max(n) > 1 for n in spy.eager)  # prefill mixed with decodes
    spy.steps.clear()
    assert_same_outputs(generate(cudagraph_capture_sizes=[2, 4], enforce_eager=True), want)
    assert spy.steps == []


def make_worker(**knobs) -> Worker:
    cfg = compose_config(["model=tiny_llama", "device=cpu", "dtype=float32", "block_size=4",
                          "max_num_seqs=4"] + [f"{k}={v}" for k, v in knobs.items()])
    worker = Worker(worker_config(cfg))
    worker.initialize_cache(num_blocks=12, max_model_len=32)
    return worker


def run_steps(worker: Worker) -> list[dict]:
    """Two prompts (blocks 1-2 and 3-4), then three decode steps of both."""
    p = SamplingParams(temperature=0)
    first = worker.execute_model(SchedulerOutput(
        scheduled_new_reqs=[NewRequestData("a", [5, 6, 7, 8, 9], p, ([1, 2],), 0),
                            NewRequestData("b", [3, 4, 5], p, ([3, 4],), 0)],
        num_scheduled_tokens={"a": 5, "b": 3}, total_num_scheduled_tokens=8))
    outs = [first.sampled_token_ids]
    for k in range(3):
        outs.append(worker.execute_model(SchedulerOutput(
            scheduled_cached_reqs=[CachedRequestData("a", ([],), 5 + k),
                                   CachedRequestData("b", ([],), 3 + k)],
            num_scheduled_tokens={"a": 1, "b": 1}, total_num_scheduled_tokens=2)
        ).sampled_token_ids)
    return outs


def test_padding_rows_write_only_the_null_block():
    eager, padded = make_worker(enforce_eager="true"), make_worker(
        cudagraph_capture_sizes="[4]")
    assert eager.runner.padded is None and padded.runner.padded.sizes == [4]
    assert run_steps(padded) == run_steps(eager)
    for a, b in zip(eager.runner.kv_caches, padded.runner.kv_caches):
        # every real block as the eager run left it (up to fp32 rounding: other GEMM shapes)
        torch.testing.assert_close(a[:, 1:], b[:, 1:], rtol=1e-4, atol=1e-4)
        assert b[:, 0].abs().sum() > 0 and a[:, 0].abs().sum() == 0  # padding wrote block 0


def test_an_fp8_cache_or_a_backend_without_support_runs_unpadded():
    assert make_worker(cudagraph_capture_sizes="[4]", **{"cache.dtype": "fp8"}).runner.padded \
        is None


@pytest.mark.parametrize(("attention", "model"), [("triton_flash", "tiny_llama"),
                                                  ("triton_mla", "tiny_deepseek"),
                                                  ("triton_flash", "tiny_gpt_oss")])
def test_triton_metadata_is_replay_safe(monkeypatch, attention, model):
    """A Triton backend's decode metadata built once per padded size and reused for every step
    (what a CUDA-graph replay does; here eagerly, in Triton's interpreter) gives the token ids of
    attention=torch. tiny_gpt_oss: a hybrid KV cache (a full and a sliding-window group, each its
    static block table) and sinks; its 21-token requests outgrow the 16-token window."""
    hybrid = model == "tiny_gpt_oss"
    prompts = [PROMPTS[2] if hybrid else PROMPTS[0], PROMPTS[1], PROMPTS[3]]
    params = SamplingParams(temperature=0, max_tokens=12 if hybrid else 5)
    knobs = dict(dtype="float32", device="cpu", block_size=4, max_model_len=24,
                 **SMALL_KV)
    ref = LLM(model, attention="torch", enforce_eager=True, **knobs)
    want = [o.outputs[0].token_ids for o in ref.generate(prompts, params)]
    ref.engine.shutdown()
    spy = PaddedSpy(monkeypatch)
    llm = LLM(model, attention=attention, cudagraph_capture_sizes=[4], **knobs)
    llm.engine.executor.worker.runner.padded.replay_metadata = True
    try:
        assert [o.outputs[0].token_ids for o in llm.generate(prompts, params)] == want
    finally:
        llm.engine.shutdown()
    assert spy.steps and all(size == 4 for _, size in spy.steps)


# -- CUDA: capture and replay ----------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize(("attention", "model"), [("triton_flash", "tiny_qwen3"),
                                                  ("triton_mla", "tiny_deepseek")])
def test_cuda_graph_replay_matches_eager(monkeypatch, attention, model):
    """With the default sizes (max_num_seqs=8: 1, 2, 4, 8) every decode step of 8 requests or
    fewer replays a captured graph, and the token ids (fp32: greedy and seeded) are those of
    enforce_eager=true."""
    prompts = [p * 3 for p in PROMPTS]
    params = [SamplingParams(temperature=0, max_tokens=16),
              SamplingParams(temperature=0.8, seed=1, max_tokens=16)] * 3
    knobs = dict(device="cuda", attention=attention, dtype="float32", block_size=16,
                 num_gpu_blocks=128, max_num_seqs=8)
    eager = LLM(model, enforce_eager=True, **knobs)
    want = [o.outputs[0].token_ids for o in eager.generate(prompts, params)]
    eager.engine.shutdown()
    del eager
    replays = []
    run = PaddedDecode.run
    monkeypatch.setattr(PaddedDecode, "run", lambda self, batch, kv: (
        replays.append(batch.padded_size in self.graphs), run(self, batch, kv))[1])
    llm = LLM(model, **knobs)
    try:
        assert sorted(llm.engine.executor.worker.runner.padded.graphs) == [1, 2, 4, 8]
        got = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    finally:
        llm.engine.shutdown()
    assert replays and all(replays)
    assert got == want


@pytest.mark.gpu
def test_graph_memory_is_counted_in_the_kv_budget():
    cfg = compose_config(["model=tiny_qwen3", "device=cuda", "attention=triton_flash",
                          "cudagraph_capture_sizes=[1,2,4,8]"])
    worker = Worker(worker_config(cfg))
    assert worker._graph_memory() > 0
