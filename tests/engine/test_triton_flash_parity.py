"""Greedy token ids with attention=triton_flash (fp32; Triton's interpreter on CPU) equal those of
attention=torch and of transformers, for tiny Llama and tiny Qwen3, in one run that forces chunked
prefill (a 16-token budget), prefix-cache hits (shared prefixes) and preemption (a tiny cache);
`kernels=triton` also puts norms and rotary through Triton (`-m slow`). The Triton run goes over
both engine clients (inproc, and mp on the first model: the interpreter runs in the core
process); the attention=torch and transformers references are computed once per model."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from lab import LLM, SamplingParams
from lab.kernels import interpreter_active
from lab.models.tiny import ensure_tiny_model
from tests.engine.parity_utils import model_name_fixture, mp_on_the_first_only
from tests.options import tiny_models

MAX_TOKENS = 8
KNOBS = dict(dtype="float32", device="cpu", block_size=4, max_num_batched_tokens=16,
             num_gpu_blocks=14, max_model_len=48)


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(11)
    shared = torch.randint(3, 500, (9,), generator=g).tolist()
    tails = [torch.randint(3, 500, (n,), generator=g).tolist() for n in (14, 3, 20, 1)]
    return [shared + t for t in tails]


def _hf(model_name: str, prompts) -> list[list[int]]:
    model = AutoModelForCausalLM.from_pretrained(ensure_tiny_model(model_name),
                                                 dtype=torch.float32).eval()
    out = []
    for p in prompts:
        ids = torch.tensor([p])
        gen = model.generate(ids, max_new_tokens=MAX_TOKENS, do_sample=False,
                             attention_mask=torch.ones_like(ids))
        out.append(gen[0, len(p):].tolist())
    return out


def _run(model_name: str, attention: str, **knobs) -> list[list[int]]:
    """The prompts through LLM(attention, KNOBS + knobs); assert that the run chunked prefills,
    hit the prefix cache, preempted and mixed prefill with decode (statistics an mp core
    process sends with its outputs) and left no request or KV block behind."""
    llm = LLM(model_name, attention=attention, **knobs, **KNOBS)
    try:
        outs = llm.generate(_prompts(), SamplingParams(temperature=0, max_tokens=MAX_TOKENS))
        steps = llm.engine.recent_steps
        assert sum(s.num_preempted for s in steps) > 0
        assert sum(s.prefix_cache_hits for s in steps) > 0
        assert any(s.num_decode_tokens == 0 and s.num_prefill_tokens == 16 for s in steps)
        assert any(s.num_decode_tokens > 0 and s.num_prefill_tokens > 0 for s in steps)
        if attention != "torch":
            # the kernels ran where the core runs (an mp core process is spawned: it sets
            # TRITON_INTERPRET itself without CUDA, lab/kernels/__init__.py)
            assert llm.engine.triton_interpreted == interpreter_active()
            if llm.engine.executor is not None:  # inproc: decode went through split-KV + merge
                assert llm.engine.executor.worker.attn_backend.workspace.out is not None
        status = llm.engine.core_status()
        assert (status.num_requests, status.num_used_blocks) == (0, 0), status
        return [o.outputs[0].token_ids for o in outs]
    finally:
        llm.engine.shutdown()


def reference_ids(model_name: str) -> list[list[int]]:
    """attention=torch (inproc) gives transformers' ids in the chunked/prefix/preempt run."""
    want = _run(model_name, "torch")
    assert want == _hf(model_name, _prompts())
    return want


def check_backend_parity(model_name: str, backend: str, kernels: str, engine_client: str,
                         want: list[list[int]]) -> None:
    """`backend` (with the `kernels` ops) through `engine_client` gives `want` (reference_ids:
    attention=torch's and transformers' ids) in a run with chunked prefill, prefix hits and
    preemption. inproc forces decode splits (the split kernel + the LSE merge); mp keeps the
    backend's own choice (one split at these lengths: a single decode launch), because in
    Triton's interpreter the forced splits and merge cost ~4 CPU-s per run, and what mp adds
    (the process boundary) does not depend on them."""
    splits = ({"attention.num_sms": 132, "attention.min_keys_per_split": 8}
              if engine_client == "inproc" else {})
    got = _run(model_name, backend, kernels=kernels, engine_client=engine_client, **splits)
    assert got == want


# tiny_qwen2 differs from tiny_llama only outside attention (q/k/v bias, tied embeddings)
MODELS = [m for m in tiny_models("gqa") if m != "tiny_qwen2"]


def model_fixtures(models: list[str], slow: tuple[str, ...] = ()):
    """The module-scoped `model_name` (over `models`; those in `slow` with `-m slow` only) and
    `reference` (its reference_ids) fixtures of a backend parity module: assign them to those
    names there."""
    model_name = model_name_fixture(models, slow)

    @pytest.fixture(scope="module")
    def reference(model_name):
        return reference_ids(model_name)

    return model_name, reference


# the default suite runs tiny_llama (Triton's norms and rotary too); the other presets differ
# outside the kernels (one KV head, q/k norms), which tests/kernels checks on every shape: -m slow
model_name, reference = model_fixtures(MODELS, slow=tuple(MODELS[1:]))


def test_triton_flash_matches_torch_and_transformers(model_name, reference, engine_client):
    """mp (a core process) on the first model only: the interpreter runs the same kernels
    there. The other ops are PyTorch's here (kernels=torch); the next test puts them through
    Triton too."""
    mp_on_the_first_only(engine_client, model_name, MODELS[0], "kernels")
    check_backend_parity(model_name, "triton_flash", "torch", engine_client, reference)


@pytest.mark.slow
def test_triton_flash_with_triton_ops_matches(model_name, reference):
    """kernels=triton (norms, rotary) as well: every op of the run in Triton's interpreter.
    `-m slow` (~5 CPU-s): TritonOps vs TorchOps is checked on every GQA preset in
    tests/kernels/test_ops_wiring.py, and the engine run above differs from this one only in
    the ops it calls."""
    check_backend_parity(model_name, "triton_flash", "triton", "inproc", reference)


def test_triton_flash_refuses_bf16_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("the interpreter restriction only applies without CUDA")
    with pytest.raises(ValueError, match="bf16|bfloat16"):
        LLM("tiny_llama", attention="triton_flash", dtype="bfloat16", num_gpu_blocks=16)
