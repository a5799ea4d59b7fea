"""The EAGLE-1 draft head (lab/models/eagle.py) and its synthetic tiny checkpoint
(lab/models/tiny_eagle.py): the generated tensors, parity with an oracle from transformers'
LlamaDecoderLayer through the paged cache (a prefill, then a decode step that reads it), the
config flags (input_layernorm, fc bias), both checkpoint naming conventions and the strict
loader."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

from lab.attention.torch_backend import TorchAttentionBackend
from lab.models.eagle import EagleHead, load_eagle
from lab.models.loader import load_model
from lab.models.tiny import preset
from lab.models.tiny_eagle import ensure_tiny_eagle, generate_tiny_eagle
from lab.models.weight_utils import SINGLE_FILE, safetensors_weights
from tests.models.prefill import scattered_table, sequence_inputs

IDS = [0, 5, 17, 300, 42, 7, 99, 250, 3]  # the last one: the decode step's token
BLOCK = 4
HIDDEN, VOCAB = 64, 512  # tiny_llama's
LAYER = {"self_attn.q_proj.weight": (64, 64), "self_attn.k_proj.weight": (32, 64),
         "self_attn.v_proj.weight": (32, 64), "self_attn.o_proj.weight": (64, 64),
         "mlp.gate_proj.weight": (128, 64), "mlp.up_proj.weight": (128, 64),
         "mlp.down_proj.weight": (64, 128), "post_attention_layernorm.weight": (64,)}


@pytest.fixture(scope="module")
def target_path(tiny_path):
    return tiny_path("tiny_llama")


@pytest.fixture(scope="module")
def path(model_cache):
    return ensure_tiny_eagle("tiny_llama", model_cache)


@pytest.fixture(scope="module")
def loaded(target_path, path):
    backend = TorchAttentionBackend()
    target, _ = load_model(target_path, backend, torch.float32, "cpu")
    return target, load_eagle(path, target, backend, torch.float32, "cpu"), backend


def variant(src, dst, config: dict | None = None, extra: dict | None = None,
            prefix: str = ""):
    """A copy of the head checkpoint at `src` in `dst`: config fields updated, tensors added,
    every name prefixed."""
    dst.mkdir()
    cfg = json.loads((src / "config.json").read_text()) | (config or {})
    (dst / "config.json").write_text(json.dumps(cfg))
    weights = load_file(src / SINGLE_FILE) | (extra or {})
    save_file({prefix + k: t for k, t in weights.items()}, str(dst / SINGLE_FILE))
    return dst


def test_checkpoint_is_eagle_layout_from_target_layer_0(path, target_path, loaded, tmp_path):
    weights = load_file(path / SINGLE_FILE)
    assert weights.keys() == {"fc.weight"} | {f"layers.0.{n}" for n in LAYER}
    assert all(weights[f"layers.0.{n}"].shape == shape for n, shape in LAYER.items())
    target = load_file(target_path / SINGLE_FILE)
    assert all(torch.equal(weights[f"layers.0.{n}"], target[f"model.layers.0.{n}"]) for n in LAYER)
    fc = weights["fc.weight"]
    assert fc.shape == (HIDDEN, 2 * HIDDEN) and torch.equal(fc[:, :HIDDEN], torch.eye(HIDDEN))
    assert 0 < fc[:, HIDDEN:].std() < 0.1  # the hidden state: a small seeded perturbation
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["architectures"] == ["EagleLlamaForCausalLM"] and cfg["num_hidden_layers"] == 1
    assert "skip_prenorm" not in cfg and "eagle_fc_bias" not in cfg  # EAGLE-1's defaults
    # deterministic: generated again, the same bytes
    again = generate_tiny_eagle(target_path, preset("tiny_llama"), tmp_path / "again")
    assert (again / SINGLE_FILE).read_bytes() == (path / SINGLE_FILE).read_bytes()
    assert ensure_tiny_eagle("tiny_llama", path.parent) == path
    target_model, head, _ = loaded
    assert head.num_kv_layers == 1 and head.layer_specs == [head.attention_spec]
    assert head.attention_spec == target_model.attention_spec  # the target's block layout
    # shared, not copied, and not the head's parameters
    assert head.embed_tokens is target_model.model.embed_tokens
    assert head.lm_head is target_model.lm_head
    assert all(n.startswith(("fc.", "layers.0.")) for n, _ in head.named_parameters())
    assert isinstance(head.layers[0].input_layernorm, nn.Identity)


class Oracle(nn.Module):
    """The head from transformers' pieces: a LlamaDecoderLayer of the head's config holding
    its checkpoint's tensors (input_layernorm identity unless the config keeps it), run over
    the whole sequence with a causal mask and no cache; fc, embedding and LM head plain
    modules (the latter two the target checkpoint's tensors)."""

    def __init__(self, path, target_path):
        super().__init__()
        cfg = AutoConfig.from_pretrained(path, attn_implementation="eager")
        w = {k.removeprefix("model."): t for k, t in safetensors_weights(path)}
        target = dict(safetensors_weights(target_path))
        self.layer = LlamaDecoderLayer(cfg, layer_idx=0).eval()
        layer = {k.removeprefix("layers.0."): t for k, t in w.items() if k.startswith("layers.0.")}
        if getattr(cfg, "skip_prenorm", True):
            self.layer.input_layernorm = nn.Identity()
        self.layer.load_state_dict(layer, strict=True)
        self.rotary = LlamaRotaryEmbedding(cfg)
        self.fc = nn.Linear(2 * HIDDEN, HIDDEN, bias="fc.bias" in w)
        self.fc.load_state_dict({k.removeprefix("fc."): t for k, t in w.items()
                                 if k.startswith("fc.")})
        self.embed = nn.Embedding.from_pretrained(target["model.embed_tokens.weight"])
        self.head = nn.Linear(HIDDEN, VOCAB, bias=False)
        self.head.load_state_dict({"weight": target["lm_head.weight"]})

    @torch.no_grad()
    def forward(self, ids: list[int], previous_hidden: torch.Tensor):
        t = len(ids)
        positions = torch.arange(t)[None]
        h = self.fc(torch.cat((self.embed(torch.tensor(ids)), previous_hidden), -1))[None]
        mask = torch.full((t, t), -torch.inf).triu(1)[None, None]
        h = self.layer(h, attention_mask=mask, position_ids=positions,
                       position_embeddings=self.rotary(h, positions))[0]
        return h, self.head(h)


def check_prefill_then_decode(head, backend, oracle):
    """The head's hidden and logits equal the oracle's: a prefill of 8 tokens writes the head's
    KV cache layer, then one decode token attends to it."""
    hidden = torch.randn(len(IDS), HIDDEN, generator=torch.Generator().manual_seed(0))
    ref_hidden, ref_logits = oracle(IDS, hidden)
    table, nblocks = scattered_table(len(IDS), BLOCK)
    kv_spec = backend.kv_cache_spec(head.attention_spec, BLOCK, torch.float32)
    caches = backend.allocate_kv_cache(kv_spec, nblocks, head.num_kv_layers, "cpu").layers
    t = len(IDS) - 1
    for start, end in ((0, t), (t, t + 1)):  # prefill, then decode through the cache
        md = backend.build_metadata(sequence_inputs(table, start, end, BLOCK))
        with torch.no_grad():
            out = head(torch.tensor(IDS[start:end]), torch.arange(start, end), hidden[start:end],
                       caches, md, step=start)
            logits = head.compute_logits(out, step=start)
        torch.testing.assert_close(out, ref_hidden[start:end], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(logits, ref_logits[start:end], atol=1e-4, rtol=1e-4)
    assert logits.dtype == torch.float32 and logits.shape == (1, VOCAB)


def test_prefill_then_decode_match_transformers(path, target_path, loaded):
    _, head, backend = loaded
    check_prefill_then_decode(head, backend, Oracle(path, target_path))


def test_input_layernorm_and_fc_bias_flags(path, target_path, loaded, tmp_path):
    """skip_prenorm: false keeps the layer's input_layernorm (its weight then required);
    eagle_fc_bias: true gives fc a bias: each loaded and run as the oracle runs them."""
    target, _, backend = loaded
    gen = torch.Generator().manual_seed(1)
    extra = {"layers.0.input_layernorm.weight": 1 + 0.1 * torch.randn(HIDDEN, generator=gen),
             "fc.bias": 0.1 * torch.randn(HIDDEN, generator=gen)}
    flagged = variant(path, tmp_path / "flagged", {"skip_prenorm": False, "eagle_fc_bias": True},
                      extra)
    head = load_eagle(flagged, target, backend, torch.float32, "cpu")
    assert not isinstance(head.layers[0].input_layernorm, nn.Identity) and head.fc.has_bias
    check_prefill_then_decode(head, backend, Oracle(flagged, target_path))
    # without the flags those tensors are not the head's: named as unexpected
    unflagged = variant(path, tmp_path / "unflagged", extra=extra)
    with pytest.raises(ValueError) as err:
        load_eagle(unflagged, target, backend, torch.float32, "cpu")
    assert "unexpected: fc.bias" in str(err.value)
    assert "unexpected: layers.0.input_layernorm.weight" in str(err.value)


def test_model_prefix_and_target_copies_load(path, loaded, tmp_path):
    """A checkpoint naming its tensors `model.*`, carrying copies of the embedding and LM head
    (the target's are used), loads into the same head."""
    target, head, backend = loaded
    copies = {"embed_tokens.weight": torch.zeros(VOCAB, HIDDEN),
              "lm_head.weight": torch.zeros(VOCAB, HIDDEN)}
    prefixed = load_eagle(variant(path, tmp_path / "prefixed", extra=copies, prefix="model."),
                          target, backend, torch.float32, "cpu")
    ours, theirs = dict(head.named_parameters()), dict(prefixed.named_parameters())
    assert ours.keys() == theirs.keys() and all(torch.equal(t, theirs[k]) for k, t in ours.items())
    assert prefixed.lm_head is target.lm_head and target.lm_head.weight.abs().sum() > 0


def test_loader_names_missing_unexpected_and_misshaped(path, loaded):
    target, _, backend = loaded
    cfg = AutoConfig.from_pretrained(path)
    weights = load_file(path / SINGLE_FILE)
    weights.pop("layers.0.mlp.up_proj.weight")
    weights.pop("layers.0.post_attention_layernorm.weight")
    weights["fc.weight"] = torch.zeros(HIDDEN, HIDDEN)
    weights["layers.1.mlp.down_proj.weight"] = torch.zeros(HIDDEN, 128)
    with pytest.raises(ValueError) as err:
        EagleHead(cfg, target, backend).load_weights(weights.items())
    msg = str(err.value)
    assert "missing: layers.0.mlp.up_proj.weight" in msg
    assert "missing: layers.0.post_attention_layernorm.weight" in msg
    assert "unexpected: layers.1.mlp.down_proj.weight" in msg
    assert "mis-shaped: fc.weight: expected shape (64, 128)" in msg
    assert "gate_proj" not in msg and "q_proj" not in msg  # what was there loaded


def test_refuses_a_target_it_cannot_share(path, loaded):
    target, _, backend = loaded
    cfg = AutoConfig.from_pretrained(path)
    for field, value, says in (("hidden_size", 32, "hidden_size 32 is not the target's 64"),
                               ("num_hidden_layers", 2, "num_hidden_layers=2")):
        bad = AutoConfig.from_pretrained(path, **{field: value})
        with pytest.raises(ValueError, match=says):
            EagleHead(bad, target, backend)
    with pytest.raises(ValueError, match="Llama-layout target"):
        EagleHead(cfg, nn.Linear(1, 1), backend)


def test_ensure_generates_into_its_own_cache(tmp_path, target_path):
    """A fresh cache gets the target and the head, the head byte for byte the shared cache's."""
    fresh = ensure_tiny_eagle("tiny_llama", tmp_path)
    shared = ensure_tiny_eagle("tiny_llama", target_path.parent)
    assert fresh.name == shared.name
    assert (fresh / SINGLE_FILE).read_bytes() == (shared / SINGLE_FILE).read_bytes()
    assert fresh.parent == tmp_path and fresh.name.startswith("tiny_llama_eagle-")
    assert any(p.name.startswith("tiny_llama-") for p in tmp_path.iterdir())
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp dir left
    with pytest.raises(ValueError, match="Llama heads"):
        ensure_tiny_eagle("tiny_deepseek", tmp_path)
