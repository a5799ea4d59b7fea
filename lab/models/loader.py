"""Build a model from a Hugging Face checkpoint directory and load its safetensors weights.

The model class comes from the one lookup table, HF `architectures` -> spec -> class
(lab/models/registry.py); the attention backend is checked against the spec's attention spec
here, once, before any layer is built.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

from lab.attention.base import AttentionBackend
from lab.config.dtypes import DTYPE_NAMES, config_dtype_name, resolve_dtype_name
from lab.distributed.parallel_state import GroupCoordinator
from lab.layers.ops import LayerOps, TorchOps
from lab.models.base import CausalLM
from lab.models.registry import arch_spec
from lab.models.weight_utils import safetensors_weights
from lab.quant.base import QuantConfig
from lab.quant.none import NoQuantConfig

DTYPES: dict[str, torch.dtype] = {name: getattr(torch, dtype) for name, dtype in DTYPE_NAMES.items()}


def config_dtype(hf_config) -> torch.dtype:
    """The checkpoint's dtype from config (`dtype` or `torch_dtype`), float32 when absent."""
    return getattr(torch, config_dtype_name(hf_config))


def resolve_dtype(dtype_knob: str, hf_config, device: str | torch.device) -> torch.dtype:
    """"auto" -> the config's dtype on CUDA, float32 on CPU; else the knob's dtype."""
    return getattr(torch, resolve_dtype_name(dtype_knob, hf_config, torch.device(device).type))


@contextmanager
def default_dtype(dtype: torch.dtype):
    """Temporarily set torch's default floating dtype (parameters are created in it)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def load_model(
    path: str | Path, attn_backend: AttentionBackend, dtype: torch.dtype,
    device: str | torch.device, ops: LayerOps | None = None, quant: QuantConfig | None = None,
    tp: GroupCoordinator | None = None, expert_parallel: bool = False, hf_config=None,
) -> tuple[CausalLM, object]:
    """Build the model for the checkpoint at `path` on `device` in `dtype` and load its weights
    strictly (ValueError naming every missing, unexpected or mis-shaped tensor). `ops` (the
    `kernels` group) computes norm/rotary/activation and the quantized GEMMs; None means
    TorchOps. `quant` (the `quant` group) gives each linear its method; None: unquantized.
    ValueError when `attn_backend` does not implement the model's attention kind.

    `tp` (the TP group; None: one rank): every rank of the group calls this with the same
    arguments and keeps its part of each layer (lab/layers/linear.py); `expert_parallel` puts
    whole MoE experts on each rank instead of splitting every expert (see CausalLM).
    `hf_config`: the checkpoint's config when the caller has read it already (None: read here)."""
    if hf_config is None:
        from transformers import AutoConfig

        hf_config = AutoConfig.from_pretrained(path)
    spec = arch_spec(hf_config)
    tp_size = tp.world_size if tp is not None else 1
    for layer_spec in set(spec.layer_attention_specs(hf_config, tp_size)):
        attn_backend.check_supported(layer_spec)
    cls = spec.model_class()
    model = build_and_load(
        lambda ops: cls(hf_config, attn_backend, ops, tp, expert_parallel=expert_parallel),
        path, hf_config, dtype, device, ops, quant)
    return model, hf_config


def build_and_load(
    build: Callable[[LayerOps], nn.Module], path: str | Path, hf_config, dtype: torch.dtype,
    device: str | torch.device, ops: LayerOps | None = None, quant: QuantConfig | None = None,
) -> nn.Module:
    """`build(ops)` on `device` in `dtype` (ops None: TorchOps), its linears given their quant
    methods (None: unquantized), the checkpoint's tensors handed to its `load_weights` (strict),
    then each method's post-load step (e.g. the kernels option packing dense weights): the
    module in eval mode. What load_model does for a CausalLM; a draft model (the DeepSeek MTP
    layers, lab/models/deepseek_mtp.py) loads the same way from the same checkpoint."""
    ops = ops or TorchOps()
    quant = (quant or NoQuantConfig()).bind(hf_config, ops)
    with torch.device(device), default_dtype(dtype):
        model = build(ops)
        quant.quantize_model(model)
    model.load_weights(safetensors_weights(path))
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if method is not None:
            method.process_weights_after_loading(module)
    return model.eval()
