"""Tiny EAGLE-1 draft heads for the tiny Llama presets, generated deterministically and cached.

`ensure_tiny_eagle(target_preset)` writes, once, an EAGLE checkpoint directory in vLLM's layout
(lab/models/eagle.py reads it): config.json (the target preset's LlamaConfig with one decoder
layer, architectures ["EagleLlamaForCausalLM"]) and model.safetensors with `fc.weight` and the
`layers.0.` tensors, unprefixed as EAGLE-1 files are, in the target preset's dtype. It lives in
the tiny-model cache beside the target, as `<target>_eagle-<hash of the target's preset and
EAGLE_VERSION>`, written to a temp dir and renamed into place (lab/models/tiny.py's
`ensure_generated`).

The head is synthetic, not trained: random weights would draft tokens the target almost never
accepts, which tests nothing of a proposer but its rejection path. So it is built to agree with
the target some of the time, cheaply and without training:

- its decoder layer is a copy of the target's layer 0 (attention, MLP, post-attention norm;
  EAGLE-1 has no input_layernorm), read from the target's generated checkpoint;
- `fc` = [I | N]: the next token's embedding passes through unchanged and the previous hidden
  state enters as a small seeded perturbation (N, std HIDDEN_NOISE / sqrt(hidden), from
  EAGLE_SEED).

So the head is the target cut after its first layer (an early exit: the embedding through
layer 0, then the LM head without the final norm), nudged by the hidden state. The obvious
alternative, fc = [N | I] (the hidden state through, the token as the perturbation), drafts
almost nothing right: the target's post-norm hidden at position t already decodes to token
t + 1, so the head predicts the token it was given. Measured on tiny_llama (greedy, 20 random
prompts, 40 generated tokens each; the first draft's token against the target's): [N | I]
0.4%, this [I | N] about 20%. Not a trained head, and not designed to a rate: a head whose
drafts are sometimes right and sometimes wrong, so that a proposer's accept and reject paths
both run.
"""

from __future__ import annotations

from pathlib import Path

import torch

from lab.models.tiny import (
    default_cache_dir,
    ensure_generated,
    ensure_tiny_model,
    hf_config,
    preset,
    preset_hash,
)
from lab.models.weight_utils import SINGLE_FILE, safetensors_weights

EAGLE_VERSION = 1  # bump when what a head is drawn from changes: a new cache entry
EAGLE_SEED = 4321
HIDDEN_NOISE = 0.05  # fc's previous-hidden block: std HIDDEN_NOISE / sqrt(hidden)
ARCHITECTURE = "EagleLlamaForCausalLM"  # vLLM's; lab's loader reads it with LlamaSpec
# the target's layer-0 tensors the head copies (EAGLE-1 has no input_layernorm)
LAYER_TENSORS = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                 "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
                 "mlp.down_proj.weight", "post_attention_layernorm.weight")


def ensure_tiny_eagle(target_preset: str = "tiny_llama",
                      cache_dir: str | Path | None = None) -> Path:
    """The directory of the synthetic EAGLE-1 head of the tiny preset `target_preset` (a Llama
    with no q/k/v bias), generating it and the target on first use; cache_dir None: the tiny
    models' default cache."""
    spec = preset(target_preset)
    if spec["model_type"] != "llama":
        raise ValueError(f"tiny EAGLE heads are Llama heads; {target_preset} is "
                         f"{spec['model_type']}")
    root = Path(cache_dir) if cache_dir else default_cache_dir()
    key = preset_hash({"eagle_head_of": spec, "eagle_version": EAGLE_VERSION})
    return ensure_generated(
        root / f"{target_preset}_eagle-{key}",
        lambda tmp: generate_tiny_eagle(ensure_tiny_model(target_preset, root, spec), spec, tmp))


def generate_tiny_eagle(target_dir: Path, spec: dict, out_dir: str | Path) -> Path:
    """Write the head of the target checkpoint at `target_dir` (of preset `spec`) into out_dir:
    config.json and model.safetensors (see the module docstring)."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = hf_config({**spec, "architecture": ARCHITECTURE, "num_hidden_layers": 1})
    config.to_json_file(out / "config.json")
    save_file(eagle_weights(target_dir, spec), str(out / SINGLE_FILE), metadata={"format": "pt"})
    return out


def eagle_weights(target_dir: Path, spec: dict) -> dict[str, torch.Tensor]:
    """The head's tensors under EAGLE-1's checkpoint names, in the preset's dtype."""
    layer0 = {name.removeprefix("model.layers.0."): t for name, t in safetensors_weights(target_dir)
              if name.startswith("model.layers.0.")}
    weights = {f"layers.0.{name}": layer0[name].clone() for name in LAYER_TENSORS}
    hidden = spec["hidden_size"]
    gen = torch.Generator().manual_seed(EAGLE_SEED)
    hidden_part = HIDDEN_NOISE * torch.randn(hidden, hidden, generator=gen) / hidden**0.5
    weights["fc.weight"] = torch.cat((torch.eye(hidden), hidden_part), dim=1)
    dtype = getattr(torch, spec["dtype"])
    return {name: t.to(dtype).contiguous() for name, t in weights.items()}
