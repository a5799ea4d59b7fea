"""The model-based proposers through the real engine: a draft model (`speculative=draft`) and
DeepSeek-V3's MTP layers (`speculative=mtp`). Greedy outputs equal the run without speculation
(the rejection sampler keeps the target's distribution, whatever the drafts); the drafts equal
a reference computed over the whole sequence at once (so the proposer's own KV, written step by
step in the target's blocks, is right); the target drafting for itself gets every draft
accepted, also with chunked prefill and preemption; the refusals name what to change."""

from __future__ import annotations

import json

import pytest
import torch

from lab.attention.torch_backend import TorchAttentionBackend
from lab.config.compose import compose_config, set_knobs
from lab.config.validate import check_speculative
from lab.core.sampling_params import SamplingParams
from lab.engine.llm import LLM
from lab.metrics import InMemoryLogger
from lab.models.deepseek_mtp import load_mtp
from lab.models.eagle import load_eagle
from lab.models.loader import load_model
from lab.models.tiny import ensure_tiny_model
from lab.models.tiny_eagle import ensure_tiny_eagle
from lab.speculative.draft import DraftModelProposer
from lab.speculative.eagle import EagleProposer, resolve_head_path
from lab.speculative.mtp import MTPProposer, check_mtp_checkpoint
from tests.kv import SMALL_KV
from tests.models.prefill import scattered_table, sequence_inputs

PROMPTS = [[5, 6, 7, 8, 9, 10, 5, 6, 7], [3, 4, 5], list(range(20, 45))]
GREEDY = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
BLOCK = 4


def generate(model: str, **knobs) -> tuple[list[list[int]], list, LLM]:
    """Greedy outputs of PROMPTS, the run's StepStats, the engine."""
    mem = InMemoryLogger()
    llm = LLM(model=model, stat_loggers=[mem], **SMALL_KV | knobs)
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)], mem.steps, llm


def drafted(steps) -> tuple[int, int]:
    """(drafts verified, drafts accepted) over the run."""
    return (sum(s.num_draft_tokens for s in steps), sum(s.num_accepted_tokens for s in steps))


@pytest.fixture
def recorded(monkeypatch):
    """Every (request's tokens, its drafts) the proposer class returned, by class."""
    records: list[tuple[list[int], list[int]]] = []

    def watch(cls):
        propose = cls.propose

        def record(self, inputs):
            tokens = [inputs.token_ids[r, :n].tolist()
                      for r, n in zip(inputs.rows.tolist(), inputs.num_tokens.tolist())]
            out = propose(self, inputs)
            records.extend((t, d) for t, d in zip(tokens, out) if d)
            return out

        monkeypatch.setattr(cls, "propose", record)
        return records

    return watch


@pytest.fixture(scope="module")
def llama_reference():
    return generate("tiny_llama")[0]


# -- references: the drafts computed over the whole sequence in one forward ----------------------
def one_forward(model, backend: TorchAttentionBackend, num_layers: int, *inputs, **kwargs):
    """model(*inputs, caches, metadata, **kwargs) over positions 0 .. T-1 (T = len(inputs[0]))
    of a fresh paged cache of the model's layout (blocks scattered: tests/models/prefill.py)."""
    t = len(inputs[0])
    table, num_blocks = scattered_table(t, BLOCK)
    spec = backend.kv_cache_spec(model.attention_spec, BLOCK, torch.float32)
    caches = backend.allocate_kv_cache(spec, num_blocks, num_layers, "cpu").layers
    with torch.no_grad():
        return model(*inputs, caches, backend.build_metadata(sequence_inputs(table, 0, t, BLOCK)),
                     **kwargs)


def greedy_drafts(model, backend, tokens: list[int], k: int) -> list[int]:
    """A draft model's k greedy tokens after `tokens`, each from a forward over everything."""
    ids = list(tokens)
    for _ in range(k):
        hidden = one_forward(model, backend, model.num_layers, torch.tensor(ids),
                             torch.arange(len(ids)))
        ids.append(int(model.compute_logits(hidden[-1:]).argmax()))
    return ids[len(tokens):]


def mtp_drafts(target, mtp, backend, tokens: list[int], k: int) -> list[int]:
    """The MTP's k drafts after `tokens` (vLLM's scheme): position p reads the target's hidden
    at p and the token at p + 1; each further draft one position on, with its own previous
    output as the hidden state and the draft before as the token."""
    hidden = one_forward(target, backend, target.num_layers, torch.tensor(tokens),
                         torch.arange(len(tokens)))
    ids, previous, drafts = tokens[1:], hidden[:-1], []
    for j in range(k):
        out = one_forward(mtp, backend, mtp.num_kv_layers, torch.tensor(ids),
                          torch.arange(len(ids)), previous, step=j)
        drafts.append(int(mtp.compute_logits(out[-1:], step=j).argmax()))
        ids, previous = ids + drafts[-1:], torch.cat((previous, out[-1:]))
    return drafts


def check_against(records, reference, min_records: int) -> None:
    assert len(records) >= min_records
    for tokens, drafts in records:
        assert drafts == reference(tokens)[: len(drafts)], tokens


# -- speculative=draft ---------------------------------------------------------------------------
@pytest.mark.parametrize("k", [1, 3])
def test_target_as_its_own_draft_gets_every_draft_accepted(llama_reference, k):
    outputs, steps, _ = generate("tiny_llama", speculative="draft",
                                 **{"speculative.num_speculative_tokens": k})
    assert outputs == llama_reference
    verified, accepted = drafted(steps)
    assert verified > 0 and accepted == verified


def test_other_model_drafts_greedily_over_its_own_kv(llama_reference, recorded):
    """tiny_qwen3 (the same vocabulary) drafts for tiny_llama: outputs unchanged, and each
    step's drafts are what tiny_qwen3 alone would generate greedily after the request's
    tokens."""
    records = recorded(DraftModelProposer)
    outputs, steps, llm = generate("tiny_llama", speculative="draft",
                                   **{"speculative.model": "tiny_qwen3"})
    assert outputs == llama_reference
    assert drafted(steps)[0] > 0
    backend = TorchAttentionBackend()
    draft, _ = load_model(ensure_tiny_model("tiny_qwen3"), backend, torch.float32, "cpu")
    check_against(records[::4], lambda tokens: greedy_drafts(draft, backend, tokens, 3), 5)
    # the KV cache's bytes per block: the target's pages and the draft's, in every block
    worker = llm.engine.core.executor.worker
    target_pages = worker.kv_spec.page_bytes * llama_layers()
    draft_pages = backend.kv_cache_spec(draft.attention_spec, worker.block_size,
                                        torch.float32).page_bytes * draft.num_layers
    assert worker.bytes_per_block == target_pages + draft_pages
    assert llm.engine.model_info.bytes_per_block == worker.bytes_per_block


def llama_layers() -> int:
    return ensure_tiny_config("tiny_llama")["num_hidden_layers"]


def ensure_tiny_config(name: str) -> dict:
    return json.loads((ensure_tiny_model(name) / "config.json").read_text())


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_chunked_prefill_and_preemption_keep_the_drafts_kv(llama_reference, preemption):
    """Prompts in chunks of 8 tokens (the draft writes its KV of chunks that emit nothing) and
    a cache of 16 blocks of 4 tokens, so requests are preempted, then recomputed or swapped back
    in (the draft's pages with the target's): the target drafting for itself still gets every
    draft accepted."""
    outputs, steps, _ = generate("tiny_llama", speculative="draft", max_num_batched_tokens=8,
                                 num_gpu_blocks=16, block_size=4, preemption=preemption,
                                 **{"cache.swap_space_gb": 0.01})
    assert outputs == llama_reference
    assert sum(s.num_preempted for s in steps) > 0
    assert (sum(s.swap_out_blocks for s in steps) > 0) == (preemption == "swap")
    verified, accepted = drafted(steps)
    assert verified > 0 and accepted == verified


def test_draft_of_another_vocabulary_is_refused(tmp_path):
    """A draft's config with another vocab_size is refused before its weights are read."""
    config = ensure_tiny_config("tiny_llama") | {"vocab_size": 256}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"speculative.model=.* vocab_size=256 .* vocab_size=512"):
        LLM(model="tiny_llama", speculative="draft", **{"speculative.model": str(tmp_path)})


def test_sliding_window_group_zero_is_refused():
    with pytest.raises(ValueError, match=r"group 0, which must be full attention.*layers 0, 1"
                                         r".*cache.hybrid=false"):
        LLM(model="tiny_mistral_sw", speculative="draft")


@pytest.mark.parametrize("option", ["draft", "mtp", "eagle"])
def test_tensor_parallel_is_refused(option):
    cfg = set_knobs(compose_config([f"speculative={option}", "executor=multiproc"]),
                    {"tensor_parallel_size": 2})
    with pytest.raises(ValueError, match=f"speculative={option} is invalid with "
                                         "tensor_parallel_size=2"):
        check_speculative(cfg)
    check_speculative(set_knobs(cfg, {"tensor_parallel_size": 1}))


# -- speculative=mtp -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def deepseek_reference():
    return generate("tiny_deepseek_mtp")[0]


@pytest.mark.parametrize("k", [1, 3])
def test_mtp_drafts_follow_the_target_hidden_states(deepseek_reference, recorded, k):
    records = recorded(MTPProposer)
    outputs, steps, _ = generate("tiny_deepseek_mtp", speculative="mtp",
                                 **{"speculative.num_speculative_tokens": k})
    assert outputs == deepseek_reference
    assert drafted(steps)[0] > 0
    path = ensure_tiny_model("tiny_deepseek_mtp")
    backend = TorchAttentionBackend()
    target, cfg = load_model(path, backend, torch.float32, "cpu")
    mtp = load_mtp(path, cfg, backend, torch.float32, "cpu")
    check_against(records[::4], lambda tokens: mtp_drafts(target, mtp, backend, tokens, k), 5)


def test_mtp_needs_mtp_layers():
    with pytest.raises(ValueError, match=r"speculative=mtp needs .*\(LlamaForCausalLM, "
                                         r"num_nextn_predict_layers=0\) has none"):
        LLM(model="tiny_llama", speculative="mtp")
    # tiny_deepseek_v3: transformers' config says one MTP layer, the checkpoint has none
    from transformers import AutoConfig

    path = ensure_tiny_model("tiny_deepseek_v3")
    cfg = AutoConfig.from_pretrained(path)
    assert cfg.num_nextn_predict_layers == 1
    with pytest.raises(ValueError, match=r"model.layers.3.\*"):
        check_mtp_checkpoint(path, cfg)


# -- speculative=eagle ---------------------------------------------------------------------------
@pytest.mark.parametrize("k", [1, 3])
def test_eagle_drafts_follow_the_target_hidden_states(llama_reference, recorded, k):
    """An EAGLE head drafts as the MTP layers do (the same scheme, the same reference): greedy
    ids equal the plain run's, and each step's drafts those of one forward over everything."""
    records = recorded(EagleProposer)
    outputs, steps, _ = generate("tiny_llama", speculative="eagle",
                                 **{"speculative.num_speculative_tokens": k})
    assert outputs == llama_reference
    verified, accepted = drafted(steps)
    assert 0 < accepted < verified  # the synthetic head is right some of the time
    backend = TorchAttentionBackend()
    target, _ = load_model(ensure_tiny_model("tiny_llama"), backend, torch.float32, "cpu")
    head = load_eagle(ensure_tiny_eagle("tiny_llama"), target, backend, torch.float32, "cpu")
    check_against(records[::4], lambda tokens: mtp_drafts(target, head, backend, tokens, k), 5)


def test_eagle_needs_a_head():
    with pytest.raises(ValueError, match="speculative.model=DIR"):
        resolve_head_path(None, "/somewhere/my-checkpoint")
    with pytest.raises(ValueError, match="is not a directory"):
        resolve_head_path("/nonexistent-head", "/somewhere")
