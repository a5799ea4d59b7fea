"""DeepSeek-V3's MTP layers (lab/models/deepseek_mtp.py): the generated checkpoint's tensors,
parity with transformers' pieces through the paged latent cache (a prefill, then a decode step
that reads it), and the strict loader."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from safetensors.torch import load_file
from torch import nn
from transformers import AutoModelForCausalLM
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RMSNorm

from lab.attention.torch_backend import TorchAttentionBackend
from lab.layers.moe import MoE
from lab.models.deepseek_mtp import DeepseekMTP, load_mtp
from lab.models.loader import load_model
from lab.models.tiny import MTP_FILE, generate_tiny_model
from lab.models.weight_utils import INDEX_FILE, safetensors_weights
from tests.models.prefill import scattered_table, sequence_inputs

N = 3  # tiny_deepseek_mtp's num_hidden_layers: its MTP layer is model.layers.3
IDS = [0, 5, 17, 300, 42, 7, 99, 250, 3]  # the last one: the decode step's token
BLOCK = 4


@pytest.fixture(scope="module")
def path(tiny_path):
    return tiny_path("tiny_deepseek_mtp")


@pytest.fixture(scope="module")
def loaded(path):
    backend = TorchAttentionBackend()
    target, cfg = load_model(path, backend, torch.float32, "cpu")
    return target, cfg, load_mtp(path, cfg, backend, torch.float32, "cpu"), backend


def test_checkpoint_has_mtp_layer_under_real_names(path, tiny_path, loaded):
    weights = dict(safetensors_weights(path))
    own = ("embed_tokens.weight", "enorm.weight", "hnorm.weight", "eh_proj.weight",
           "shared_head.norm.weight", "shared_head.head.weight", "input_layernorm.weight",
           "post_attention_layernorm.weight", "self_attn.q_a_proj.weight",
           "self_attn.kv_b_proj.weight", "mlp.gate.weight", "mlp.gate.e_score_correction_bias",
           "mlp.experts.7.down_proj.weight", "mlp.shared_experts.up_proj.weight")
    assert all(f"model.layers.{N}.{name}" in weights for name in own)
    assert weights[f"model.layers.{N}.eh_proj.weight"].shape == (64, 128)
    assert torch.equal(weights[f"model.layers.{N}.embed_tokens.weight"],
                       weights["model.embed_tokens.weight"])
    assert torch.equal(weights[f"model.layers.{N}.shared_head.head.weight"],
                       weights["lm_head.weight"])
    # the target is tiny_deepseek_v3's, tensor for tensor; it loads, skipping the MTP layer
    v3 = load_file(tiny_path("tiny_deepseek_v3") / "model.safetensors")
    target = {k: t for k, t in weights.items() if not k.startswith(f"model.layers.{N}.")}
    assert target.keys() == v3.keys() and all(torch.equal(t, v3[k]) for k, t in target.items())
    model, _, mtp, _ = loaded
    assert model.num_layers == N and mtp.num_kv_layers == 1
    assert isinstance(mtp.layers[0].mtp_block.mlp, MoE)  # layer 3 >= first_k_dense_replace


def test_sharded_checkpoint_lists_mtp_file(path, tmp_path):
    """Sharded by transformers, the MTP tensors go to their own file, listed in the index."""
    sharded = generate_tiny_model("tiny_deepseek_mtp", tmp_path, max_shard_size="200KB")
    index = json.loads((sharded / INDEX_FILE).read_text())["weight_map"]
    assert index[f"model.layers.{N}.eh_proj.weight"] == MTP_FILE
    assert len(set(index.values())) > 2
    ours, theirs = dict(safetensors_weights(sharded)), dict(safetensors_weights(path))
    assert ours.keys() == theirs.keys() and all(torch.equal(t, theirs[k]) for k, t in ours.items())


class Oracle(nn.Module):
    """The MTP layer from transformers' pieces: transformers loads the decoder block as layer N
    of a DeepseekV3ForCausalLM with N + 1 layers (its own expert conversion), run over the whole
    sequence with a causal mask and no cache; embedding, norms, eh_proj and head are plain
    modules holding the checkpoint's tensors."""

    def __init__(self, path):
        super().__init__()
        hf = AutoModelForCausalLM.from_pretrained(path, num_hidden_layers=N + 1,
                                                  dtype=torch.float32, attn_implementation="eager")
        self.block, self.rotary = hf.model.layers[N].eval(), hf.model.rotary_emb
        w = {k.removeprefix(f"model.layers.{N}."): t for k, t in safetensors_weights(path)
             if k.startswith(f"model.layers.{N}.")}
        self.embed = nn.Embedding.from_pretrained(w["embed_tokens.weight"])
        self.enorm, self.hnorm, self.norm = (self._norm(w[f"{n}.weight"], hf.config.rms_norm_eps)
                                             for n in ("enorm", "hnorm", "shared_head.norm"))
        self.eh_proj = nn.Linear(128, 64, bias=False)
        self.head = nn.Linear(64, 512, bias=False)
        with torch.no_grad():
            self.eh_proj.weight.copy_(w["eh_proj.weight"])
            self.head.weight.copy_(w["shared_head.head.weight"])

    @staticmethod
    def _norm(weight, eps) -> DeepseekV3RMSNorm:
        norm = DeepseekV3RMSNorm(weight.shape[0], eps)
        with torch.no_grad():
            norm.weight.copy_(weight)
        return norm

    @torch.no_grad()
    def forward(self, ids: list[int], previous_hidden: torch.Tensor):
        t = len(ids)
        positions = torch.arange(t)
        e = self.embed(torch.tensor(ids))
        e[positions == 0] = 0
        h = self.eh_proj(torch.cat((self.enorm(e), self.hnorm(previous_hidden)), -1))[None]
        mask = torch.full((t, t), -torch.inf).triu(1)[None, None]
        h = self.block(h, attention_mask=mask, position_ids=positions[None],
                       position_embeddings=self.rotary(h, positions[None]))[0]
        return h, self.head(self.norm(h))


def test_prefill_then_decode_match_transformers(path, loaded):
    """MTP's hidden and logits equal the oracle's: a prefill of 8 tokens writes the MTP layer's
    latent cache, then one decode token attends to it."""
    _, _, mtp, backend = loaded
    hidden = torch.randn(len(IDS), 64, generator=torch.Generator().manual_seed(0))
    ref_hidden, ref_logits = Oracle(path)(IDS, hidden)
    table, nblocks = scattered_table(len(IDS), BLOCK)
    kv_spec = backend.kv_cache_spec(mtp.attention_spec, BLOCK, torch.float32)
    caches = backend.allocate_kv_cache(kv_spec, nblocks, mtp.num_kv_layers, "cpu").layers
    t = len(IDS) - 1
    for start, end in ((0, t), (t, t + 1)):  # prefill, then decode through the cache
        md = backend.build_metadata(sequence_inputs(table, start, end, BLOCK))
        with torch.no_grad():
            out = mtp(torch.tensor(IDS[start:end]), torch.arange(start, end), hidden[start:end],
                      caches, md)
            logits = mtp.compute_logits(out)
        torch.testing.assert_close(out, ref_hidden[start:end], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(logits, ref_logits[start:end], atol=1e-4, rtol=1e-4)
    assert logits.dtype == torch.float32 and logits.shape == (1, 512)


def test_loader_names_missing_unexpected_and_misshaped(loaded, path):
    _, cfg, _, backend = loaded
    weights = {k: t for k, t in safetensors_weights(path)}
    weights.pop(f"model.layers.{N}.enorm.weight")
    weights.pop(f"model.layers.{N}.mlp.experts.5.up_proj.weight")
    weights[f"model.layers.{N}.eh_proj.weight"] = torch.zeros(64, 64)
    weights[f"model.layers.{N}.bogus.weight"] = torch.zeros(2)
    with pytest.raises(ValueError) as err:
        DeepseekMTP(cfg, backend).load_weights(weights.items())
    msg = str(err.value)
    assert f"missing: model.layers.{N}.enorm.weight" in msg
    assert f"missing: model.layers.{N}.mlp.experts.5.up_proj.weight" in msg
    assert f"unexpected: model.layers.{N}.bogus.weight" in msg
    assert f"mis-shaped: model.layers.{N}.eh_proj.weight: expected shape (64, 128)" in msg
    assert "model.layers.0." not in msg and "lm_head" not in msg  # the target's: not its business


def test_second_layer_is_required_and_steps_cycle(loaded, path):
    """With num_nextn_predict_layers 2 the loader wants model.layers.4 too; step k runs layer
    k % 2."""
    _, cfg, _, backend = loaded
    two = copy.deepcopy(cfg)
    two.num_nextn_predict_layers = 2
    mtp = DeepseekMTP(two, backend)
    assert mtp.num_kv_layers == 2
    with pytest.raises(ValueError, match=r"missing: model\.layers\.4\.eh_proj\.weight") as err:
        mtp.load_weights(safetensors_weights(path))
    assert f"model.layers.{N}." not in str(err.value)
    called = []
    for i, layer in enumerate(mtp.layers):
        layer.forward = lambda *args, i=i: called.append((i, args[3])) or args[2]
    for step in range(3):
        mtp(torch.tensor([1]), torch.tensor([0]), torch.zeros(1, 64), ["kv0", "kv1"], None, step)
    assert called == [(0, "kv0"), (1, "kv1"), (0, "kv0")]
