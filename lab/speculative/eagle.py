"""An EAGLE head as the proposer (`speculative=eagle`, vLLM's `eagle` method; the head:
lab/models/eagle.py): one decoder layer over fc(embedding of the next token, the target's hidden
state), the target's own LM head for its logits. It drafts as DeepSeek's MTP layers do
(lab/speculative/mtp.py, HiddenStateProposer): the head at position p reads the target's
hidden state at p and the token at p + 1; further drafts feed its own output back.

`speculative.model` is the head's checkpoint directory (vLLM's EAGLE-1 layout: config.json,
`fc.weight`, `layers.0.*`); null on a tiny Llama preset: a synthetic head generated for it
(lab/models/tiny_eagle.py: the target cut after its first layer, so some drafts are right —
not a trained head).
"""

from __future__ import annotations

from pathlib import Path

import torch

from lab.speculative.base import ProposerContext
from lab.speculative.mtp import HiddenStateProposer


def resolve_head_path(model: str | None, target_path) -> Path:
    """The head's checkpoint directory: `speculative.model`, or the synthetic head of the tiny
    preset the target was generated from (its cache directory is `<preset>-<hash>`)."""
    if model is not None:
        path = Path(str(model)).expanduser()
        if not path.is_dir():
            raise ValueError(f"speculative.model={model!r} is not a directory: give an EAGLE "
                             "head's checkpoint directory (config.json, fc.weight, layers.0.*)")
        return path
    from lab.models.tiny import preset_names
    from lab.models.tiny_eagle import ensure_tiny_eagle

    preset = Path(str(target_path)).name.rsplit("-", 1)[0]
    if preset not in preset_names():
        raise ValueError("speculative=eagle needs speculative.model=DIR, an EAGLE head's "
                         "checkpoint directory (a synthetic head is generated only for lab's "
                         "tiny Llama presets)")
    return ensure_tiny_eagle(preset, Path(str(target_path)).parent)


class EagleProposer(HiddenStateProposer):
    """Drafts of an EAGLE head (module docstring)."""

    name = "eagle"

    def __init__(self, context: ProposerContext, num_speculative_tokens: int,
                 model: str | None = None) -> None:
        self.head_path = resolve_head_path(model, context.model_path)
        super().__init__(context, num_speculative_tokens)

    def load_head(self, context: ProposerContext) -> torch.nn.Module:
        from lab.models.eagle import load_eagle

        return load_eagle(self.head_path, context.model, context.attn_backend, context.dtype,
                          context.device, context.ops)
