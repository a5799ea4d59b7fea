"""DeepSeek-V3's multi-token-prediction (MTP) layers, as a draft model for speculative decoding.

A V3 checkpoint ships `num_nextn_predict_layers` MTP layers after its decoder layers, under
`model.layers.{N + i}.` (N = num_hidden_layers; the target, lab/models/deepseek.py, skips them).
Trained to predict one token further ahead, each fuses the embedding of the next token with the
hidden state the model had one position earlier and runs one full decoder layer on the result
(vLLM's DeepSeekMultiTokenPredictorLayer):

    e = embed_tokens(input_ids);  e[positions == 0] = 0
    h = eh_proj(cat(enorm(e), hnorm(previous_hidden)))        [T, 2 hidden] -> [T, hidden]
    h, residual = mtp_block(positions, h, residual=None)      a DeepseekDecoderLayer
    h = residual + h                                          -> forward()'s output
    logits = shared_head.head(shared_head.norm(h))            -> compute_logits()

`previous_hidden` is, as vLLM passes it, the target's `forward()` output: the final hidden
state after the target's `model.norm` (DeepseekV2ForCausalLM.forward returns it), at the
position before each input token; for a further draft step, the previous MTP step's output.
Step k of a draft uses layer k % num_nextn_predict_layers (`step`), as vLLM does.

Each MTP layer owns one KV cache layer in the target's MLA layout (`attention_spec`): the
`kv_caches` handed to forward are the draft's own, `num_kv_layers` of them, and layer i attends
with `layer_idx` i (so an fp8 cache's KVScales are the draft's KVCache's, not the target's).
Its decoder block is the target's DeepseekDecoderLayer built as checkpoint layer N + i would be
(MoE or dense by is_moe_layer, the target's router); its parameters live under `mtp_block.`
and load from `model.layers.{N + i}.` (vLLM's renaming), the rest (embed_tokens, enorm, hnorm,
eh_proj, shared_head) under their own names. Tensor parallel as the target's layers; eh_proj
is replicated.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn

from lab.attention.base import AttentionBackend, layer_metadata
from lab.distributed.parallel_state import GroupCoordinator
from lab.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from lab.layers.linear import Linear
from lab.layers.norm import RMSNorm
from lab.layers.ops import LayerOps, TorchOps
from lab.layers.rotary import RotaryEmbedding
from lab.models.deepseek import (
    LAYER_NAME,
    SKIPPED,
    DeepseekDecoderLayer,
    DeepseekV2ForCausalLM,
    checkpoint_names,
    load_tensor,
    mla_rotary,
)
from lab.models.deepseek_arch import check_moe_tp, is_moe_layer
from lab.models.loader import build_and_load
from lab.models.registry import arch_spec, model_class
from lab.models.weight_utils import WeightCheck

# an MTP layer's own modules; every other tensor of the layer is its decoder block's
MTP_OWN = ("embed_tokens", "enorm", "hnorm", "eh_proj", "shared_head")


class SharedHead(nn.Module):
    """The MTP layer's output norm and LM head (checkpoint `shared_head.norm` / `.head`)."""

    def __init__(self, cfg, ops: LayerOps, tp: GroupCoordinator):
        super().__init__()
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, ops=ops)
        self.head = ParallelLMHead(cfg.vocab_size, cfg.hidden_size, tp=tp)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor | None:
        return self.head(self.norm(hidden))


class DeepseekMTPLayer(nn.Module):
    """One MTP layer: checkpoint layer `index`, attending as KV cache layer `slot`."""

    def __init__(self, cfg, index: int, slot: int, backend: AttentionBackend,
                 rotary: RotaryEmbedding, rope_style: str, make_gate, ops: LayerOps,
                 tp: GroupCoordinator, expert_parallel: bool):
        super().__init__()
        hidden = cfg.hidden_size
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, hidden, tp=tp)
        self.enorm = RMSNorm(hidden, cfg.rms_norm_eps, ops=ops)
        self.hnorm = RMSNorm(hidden, cfg.rms_norm_eps, ops=ops)
        self.eh_proj = Linear(2 * hidden, hidden, tp=tp)
        gate = make_gate(cfg) if is_moe_layer(cfg, index) else None
        self.mtp_block = DeepseekDecoderLayer(cfg, slot, backend, rotary, rope_style, gate, ops,
                                              tp, expert_parallel)
        self.shared_head = SharedHead(cfg, ops, tp)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                previous_hidden: torch.Tensor, kv_cache, metadata) -> torch.Tensor:
        """The fused input through the decoder block; returns residual + block output."""
        e = self.embed_tokens(input_ids).masked_fill((positions == 0).unsqueeze(-1), 0.0)
        h = self.eh_proj(torch.cat((self.enorm(e), self.hnorm(previous_hidden)), dim=-1))
        h, residual = self.mtp_block(h, None, positions, kv_cache, metadata)
        return residual + h


class DeepseekMTP(nn.Module):
    """The `num_nextn_predict_layers` MTP layers of a DeepSeek-V3 checkpoint (see the module
    docstring). Built like the target, `(hf_config, attn_backend, ops, tp)`, under the
    device and dtype it runs in; filled by `load_weights` (or built and loaded by `load_mtp`)."""

    # as the target's: MLA reads kv_b_proj's weight as per-head views (lab/quant/base.py)
    dense_linears = DeepseekV2ForCausalLM.dense_linears

    def __init__(self, hf_config, attn_backend: AttentionBackend, ops: LayerOps | None = None,
                 tp: GroupCoordinator | None = None, expert_parallel: bool = False):
        super().__init__()
        cfg = hf_config
        target = model_class(cfg)
        count = getattr(cfg, "num_nextn_predict_layers", 0) or 0
        if not issubclass(target, DeepseekV2ForCausalLM) or count < 1:
            raise ValueError(f"{target.__name__} with num_nextn_predict_layers={count}: no "
                             "DeepSeek MTP layers to build")
        self.config, self.ops = cfg, ops or TorchOps()
        self.tp = tp or GroupCoordinator.single()
        check_moe_tp(cfg, self.tp.world_size, expert_parallel)
        self.attention_spec = target.arch_spec.attention_spec(cfg, self.tp.world_size)
        self.layer_specs = [self.attention_spec] * count  # one per KV cache layer, as a CausalLM's
        self.first_layer = cfg.num_hidden_layers  # checkpoint index of MTP layer 0
        style = target.arch_spec.rope_style(cfg)
        self.rotary_emb = mla_rotary(cfg, style, self.ops)
        self.layers = nn.ModuleList(
            DeepseekMTPLayer(cfg, self.first_layer + i, i, attn_backend, self.rotary_emb, style,
                             target.make_gate, self.ops, self.tp, expert_parallel)
            for i in range(count))

    @property
    def num_kv_layers(self) -> int:
        """KV cache layers the draft needs (one per MTP layer, `attention_spec`'s layout)."""
        return len(self.layers)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                previous_hidden: torch.Tensor, kv_caches: list[torch.Tensor],
                attn_metadata: object, step: int = 0) -> torch.Tensor:
        """input_ids, positions [T], previous_hidden [T, hidden] -> hidden [T, hidden] of MTP
        layer step % num_kv_layers (pre shared_head.norm: the next step's previous_hidden).
        kv_caches: the draft's, one per MTP layer; attn_metadata: the step's."""
        i = step % len(self.layers)
        return self.layers[i](input_ids, positions, previous_hidden, kv_caches[i],
                              layer_metadata(attn_metadata, i))

    def compute_logits(self, hidden: torch.Tensor, step: int = 0) -> torch.Tensor | None:
        """Hidden [N, hidden] of step `step` -> float32 logits [N, vocab] through that layer's
        shared_head, on the TP group's rank 0 (None on the others; every rank calls it)."""
        return self.layers[step % len(self.layers)].shared_head(hidden)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load the MTP layers' tensors (`model.layers.{N + i}.*`) from a whole checkpoint's,
        ignoring the target's; strict over those layers as the target's loader is (ValueError
        naming every missing, unexpected and mis-shaped tensor by its checkpoint name).
        Returns the parameters' names."""
        params = dict(self.named_parameters())
        experts = getattr(self.config, "n_routed_experts", None)
        check = WeightCheck()
        for name, tensor in weights:
            local = self._param_name(name)
            if local is not None and not name.endswith(SKIPPED):
                load_tensor(params, local, tensor, check, experts, report_as=name)
        check.finish(self._checkpoint_name(c) for p in params for c in checkpoint_names(p, experts))
        return set(params)

    def _param_name(self, name: str) -> str | None:
        """`model.layers.{N + i}.rest` -> `layers.{i}.rest` (`layers.{i}.mtp_block.rest` for the
        decoder block's); None for a tensor outside the MTP layers."""
        layer = LAYER_NAME.match(name)
        i = int(layer.group(1)) - self.first_layer if layer is not None else -1
        if not 0 <= i < len(self.layers):
            return None
        rest = name[layer.end():]
        block = "" if rest.split(".", 1)[0] in MTP_OWN else "mtp_block."
        return f"layers.{i}.{block}{rest}"

    def _checkpoint_name(self, local: str) -> str:
        """The inverse of `_param_name`."""
        _, i, rest = local.split(".", 2)
        return f"model.layers.{self.first_layer + int(i)}.{rest.removeprefix('mtp_block.')}"


def load_mtp(path: str | Path, hf_config, attn_backend: AttentionBackend, dtype: torch.dtype,
             device: str | torch.device, ops: LayerOps | None = None,
             tp: GroupCoordinator | None = None, expert_parallel: bool = False) -> DeepseekMTP:
    """The MTP layers of the checkpoint at `path` (whose config is `hf_config`), built and
    loaded as load_model loads the target (lab/models/loader.py): on `device` in `dtype`, dense
    linears bound to `ops`, strict. ValueError when `attn_backend` does not run MLA."""
    tp_size = tp.world_size if tp is not None else 1
    attn_backend.check_supported(arch_spec(hf_config).attention_spec(hf_config, tp_size))
    return build_and_load(
        lambda ops: DeepseekMTP(hf_config, attn_backend, ops, tp, expert_parallel),
        path, hf_config, dtype, device, ops)
