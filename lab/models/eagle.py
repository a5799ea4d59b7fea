"""An EAGLE-1 draft head for a Llama target (Li et al. 2024; vLLM's EagleLlamaForCausalLM).

The head is one Llama decoder layer that, at each position, fuses the embedding of the next
token with the target's hidden state at the position before it:

    h = fc(cat(embed_tokens(input_ids), previous_hidden))     [T, 2 hidden] -> [T, hidden]
    h, residual = layers[0](h, residual=None)                 lab's LlamaDecoderLayer
    h = h + residual                                          -> forward()'s output
    logits = lm_head(h)                                       -> compute_logits()

It runs under the same interface as DeepSeek's MTP layers (lab/models/deepseek_mtp.py), so one
proposer drives either: `forward(input_ids, positions, previous_hidden, kv_caches,
attn_metadata, step)`, `compute_logits(hidden, step)`, `num_kv_layers`, `attention_spec`,
`layer_specs`, `load_weights`.

Choices, each vLLM's (vllm/model_executor/models/llama_eagle.py and its EAGLE proposer):

- `embed_tokens` and `lm_head` are the target's, shared (the same modules, not copies): EAGLE-1
  was trained on the target's frozen embedding and head, and its checkpoints either omit them
  or carry copies (which `load_weights` skips). The head holds them without registering them
  as submodules, so its parameters, `load_weights`' strictness and `.to()` are its own.
- No final norm: `compute_logits` is the target's `lm_head` on the head's output (residual
  added back) directly, as EAGLE-1's reference code and vLLM compute the draft's logits. The
  target's final norm is not applied.
- The decoder layer skips its `input_layernorm` (vLLM swaps it for identity; EAGLE's reference
  code has none): the fused `fc` output is the layer's input and its residual. A head whose
  config sets `skip_prenorm: false` (vLLM's earlier EAGLE config field) keeps the norm and
  loads `layers.0.input_layernorm.weight`.
- `fc` has no bias unless the config sets `eagle_fc_bias: true` (vLLM's field for EAGLE-1
  checkpoints that ship `fc.bias`).
- `previous_hidden` is the target's `forward()` output at the position before each input
  token: lab's Llama returns its hidden states after the final norm, as vLLM's LlamaModel does
  and as vLLM's runner hands them to the EAGLE proposer (and as EAGLE-1 was trained: the
  output of HF's LlamaModel, also post-norm). For a further draft step it is the head's own
  previous `forward()` output.
- One decoder layer, used at every step (`step` is accepted for the MTP interface and
  ignored).

KV cache: the head owns one KV cache layer (`num_kv_layers` = 1) in the layout of its own
config (`attention_spec`, LlamaSpec's: an EAGLE head repeats its target's head counts, so this
is the target's layout); its layer attends as `layer_idx` 0 of the `kv_caches` handed to
`forward`, the draft's own, not the target's.

Checkpoint (vLLM's EAGLE layout, e.g. yuhuili/EAGLE-LLaMA3-Instruct-8B): a directory of its own
with a LlamaConfig (`num_hidden_layers: 1`; architectures EagleLlamaForCausalLM or
LlamaForCausalLM) and tensors `fc.weight` [hidden, 2 hidden], `layers.0.self_attn.{q,k,v,o}_proj`,
`layers.0.mlp.{gate,up,down}_proj`, `layers.0.post_attention_layernorm`, with or without a
`model.` prefix. Tensor parallel on the target's group, as its layers; `fc` is replicated.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn

from lab.attention.base import AttentionBackend, layer_metadata
from lab.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from lab.layers.linear import Linear, default_weight_loader
from lab.layers.ops import LayerOps
from lab.layers.rotary import RotaryEmbedding
from lab.models.arch import check_tp_divisible
from lab.models.llama import STACKED, LlamaDecoderLayer, LlamaForCausalLM, LlamaModel
from lab.models.llama_arch import LlamaSpec, head_dim_of
from lab.models.loader import build_and_load
from lab.models.weight_utils import WeightCheck

# tensors an EAGLE checkpoint may carry that are the target's here (shared) or not parameters
TARGET_OWNED = ("embed_tokens.weight", "lm_head.weight")
SKIPPED = ("rotary_emb.inv_freq",)


class EagleHead(nn.Module):
    """An EAGLE-1 head (see the module docstring) on `target_model`, a lab Llama-family
    CausalLM whose embedding and LM head it shares. Built under the device and dtype it runs
    in; filled by `load_weights` (or built and loaded by `load_eagle`). `ops` None: the
    target's."""

    def __init__(self, head_config, target_model: LlamaForCausalLM,
                 attn_backend: AttentionBackend, ops: LayerOps | None = None):
        super().__init__()
        cfg = head_config
        check_target(cfg, target_model)
        self.config, self.ops, self.tp = cfg, ops or target_model.ops, target_model.tp
        check_tp_divisible(cfg, self.tp.world_size, ("intermediate_size",))
        self.attention_spec = LlamaSpec.attention_spec(cfg, self.tp.world_size)
        self.layer_specs = LlamaSpec.layer_attention_specs(cfg, self.tp.world_size)
        self.input_layernorm = not getattr(cfg, "skip_prenorm", True)
        self.fc = Linear(2 * cfg.hidden_size, cfg.hidden_size,
                         bias=bool(getattr(cfg, "eagle_fc_bias", False)), tp=self.tp)
        self.rotary_emb = RotaryEmbedding.from_hf_config(cfg, head_dim_of(cfg), ops=self.ops)
        layer = LlamaDecoderLayer(cfg, LlamaSpec.arch(cfg), 0, self.layer_specs[0],
                                  attn_backend, self.rotary_emb, self.ops, self.tp)
        if not self.input_layernorm:
            layer.input_layernorm = nn.Identity()
        self.layers = nn.ModuleList([layer])
        # the target's modules, held unregistered (a tuple): shared, not the head's parameters
        self._target = (target_model.model.embed_tokens, target_model.lm_head)

    @property
    def embed_tokens(self) -> VocabParallelEmbedding:
        """The target's embedding (shared)."""
        return self._target[0]

    @property
    def lm_head(self) -> ParallelLMHead:
        """The target's LM head (shared)."""
        return self._target[1]

    @property
    def num_kv_layers(self) -> int:
        """KV cache layers the draft needs: its one decoder layer's (`attention_spec`)."""
        return len(self.layers)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                previous_hidden: torch.Tensor, kv_caches: list[torch.Tensor],
                attn_metadata: object, step: int = 0) -> torch.Tensor:
        """input_ids, positions [T], previous_hidden [T, hidden] (the target's post-norm output,
        or the head's previous output) -> hidden [T, hidden], the decoder layer's output with
        its residual added back (no norm: the next step's previous_hidden and compute_logits'
        input). kv_caches: the draft's (one); attn_metadata: the step's; step: ignored (one
        layer serves every step)."""
        h = self.fc(torch.cat((self.embed_tokens(input_ids), previous_hidden), dim=-1))
        h, residual = self.layers[0](h, None, positions, kv_caches[0],
                                     layer_metadata(attn_metadata, 0))
        return h + residual

    def compute_logits(self, hidden: torch.Tensor, step: int = 0) -> torch.Tensor | None:
        """Hidden [N, hidden] -> float32 logits [N, vocab] through the target's LM head, with no
        norm before it (EAGLE-1's and vLLM's), on the TP group's rank 0 (None on the others;
        every rank calls it). step: ignored."""
        return self.lm_head(hidden)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load an EAGLE checkpoint's tensors (`fc.*`, `layers.0.*`, each with or without a
        `model.` prefix; q/k/v and gate/up fused at load), skipping the embedding and LM head
        it may carry (the target's are used); strict: ValueError naming every missing,
        unexpected and mis-shaped tensor by its checkpoint name (a missing one by its
        unprefixed name). Returns the parameters' names."""
        params = dict(self.named_parameters())
        check = WeightCheck()
        for name, tensor in weights:
            local = name.removeprefix("model.")
            if local in TARGET_OWNED or local.endswith(SKIPPED):
                continue
            param_name, shard = STACKED.to_param(local)
            param = params.get(param_name)
            if param is None:
                check.unexpected.append(name)
                continue
            loader = getattr(param, "weight_loader", default_weight_loader)
            try:
                loader(param, tensor) if shard is None else loader(param, tensor, shard)
            except ValueError as err:
                check.mis_shaped.append(f"{name}: {err}")
                continue
            check.seen.add(local)
        check.finish(c for p in params for c in STACKED.to_checkpoint(p))
        return set(params)


def check_target(head_config, target_model) -> None:
    """ValueError unless `target_model` is a Llama-layout CausalLM (embedding, stack, LM head
    as lab/models/llama.py builds them) of the head's hidden size and vocabulary, and the
    head has the one decoder layer EAGLE-1 has."""
    if not isinstance(target_model, LlamaForCausalLM) or not isinstance(
            getattr(target_model, "model", None), LlamaModel):
        raise ValueError(f"an EAGLE head drafts for a Llama-layout target, not "
                         f"{type(target_model).__name__}")
    target = target_model.config
    for name in ("hidden_size", "vocab_size"):
        if getattr(head_config, name) != getattr(target, name):
            raise ValueError(f"the EAGLE head's {name} {getattr(head_config, name)} is not the "
                             f"target's {getattr(target, name)} (it shares the target's "
                             "embedding and LM head)")
    if head_config.num_hidden_layers != 1:
        raise ValueError(f"an EAGLE-1 head has one decoder layer, the config says "
                         f"num_hidden_layers={head_config.num_hidden_layers}")


def load_eagle(path: str | Path, target_model: LlamaForCausalLM, attn_backend: AttentionBackend,
               dtype: torch.dtype, device: str | torch.device,
               ops: LayerOps | None = None) -> EagleHead:
    """The EAGLE head whose checkpoint directory is `path` (config.json + safetensors), on
    `target_model` (already loaded: the head shares its embedding and LM head), built and
    loaded as load_model loads a model (lab/models/loader.py): on `device` in `dtype`, dense
    linears bound to `ops` (None: the target's), strict. ValueError when `attn_backend` does
    not implement the head's attention or the target does not fit the head."""
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(path)
    for spec in set(LlamaSpec.layer_attention_specs(cfg, target_model.tp.world_size)):
        attn_backend.check_supported(spec)
    return build_and_load(lambda ops: EagleHead(cfg, target_model, attn_backend, ops),
                          path, cfg, dtype, device, ops or target_model.ops)
