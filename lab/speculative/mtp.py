"""Heads on the target's hidden states as the proposer: DeepSeek-V3's multi-token-prediction
layers (`speculative=mtp`; the module: lab/models/deepseek_mtp.py) and, with the same scheme, an
EAGLE head (`speculative=eagle`, lab/speculative/eagle.py) — vLLM's MTP / EAGLE proposer.

The head (MTP, EAGLE) at position p reads the target's hidden state at p and the token at p + 1, and predicts
the token at p + 2. Each step, per request i (c = num_computed, n = num_scheduled, r =
num_rejected; the target computed positions c .. c + n - r - 1 validly):

    forward over positions c .. c + n - r - 1: input tokens token_ids[row, p + 1] (a sampled
        request's last is its emitted token, a prompt chunk's the next prompt token), previous
        hidden = the target's hidden rows of those positions; logits at the last -> d1
        (requests that emitted tokens only)
    draft j = 2 .. k: one position further, input token d(j-1), previous hidden = the MTP's own
        output of the draft before, MTP layer (j - 1) % num_nextn_predict_layers

Its KV (one layer per MTP layer, the target's MLA layout) lives in the target's blocks
(lab/speculative/model_proposer.py). The token one position ahead is read through the runner's
token table shifted by one column, so a position's input token is the table's next one.
A block the prefix cache shares holds the MTP's KV of its last position computed from the token
after the block, which another request may not share: that costs acceptance, never output.
"""

from __future__ import annotations

from abc import abstractmethod

import numpy as np
import torch

from lab.speculative.base import ProposeInputs, ProposerContext
from lab.speculative.model_proposer import (
    ModelProposer,
    ProposerKV,
    empty_drafts,
    last_rows,
    write_drafts,
)


def has_mtp_weights(path, first_layer: int) -> bool:
    """Whether the checkpoint holds MTP layer 0's tensors (`model.layers.{first_layer}.`): a
    config may name num_nextn_predict_layers (transformers defaults it to 1 for DeepSeek-V3)
    where the checkpoint ships none."""
    from safetensors import safe_open

    from lab.models.weight_utils import safetensors_files

    prefix = f"model.layers.{first_layer}."
    for file in safetensors_files(path):
        with safe_open(str(file), framework="pt") as f:
            if any(name.startswith(prefix) for name in f.keys()):  # noqa: SIM118
                return True
    return False


def check_mtp_checkpoint(path, hf_config) -> None:
    """Refuse a target without MTP layers, naming what is missing."""
    count = getattr(hf_config, "num_nextn_predict_layers", 0) or 0
    arch = (getattr(hf_config, "architectures", None) or ["?"])[0]
    if count < 1 or not has_mtp_weights(path, hf_config.num_hidden_layers):
        raise ValueError(
            f"speculative=mtp needs a DeepSeek-V3 checkpoint with multi-token-prediction layers "
            f"(num_nextn_predict_layers >= 1 and their weights, model.layers."
            f"{hf_config.num_hidden_layers}.*); the target ({arch}, num_nextn_predict_layers="
            f"{count}) has none: use speculative=draft or ngram, or a model such as "
            "tiny_deepseek_mtp")


class HiddenStateProposer(ModelProposer):
    """Drafts of a head that fuses the target's hidden state with the next token's embedding
    (module docstring): DeepSeek's MTP layers, an EAGLE head. A subclass loads the head
    (`load_head`): a module with `forward(input_ids, positions, previous_hidden, kv_caches,
    attn_metadata, step)`, `compute_logits(hidden, step)`, `attention_spec` and
    `num_kv_layers`."""

    def __init__(self, context: ProposerContext, num_speculative_tokens: int) -> None:
        super().__init__(context, num_speculative_tokens)
        self.model = self.load_head(context)
        self.kv = ProposerKV(context.attn_backend, self.model.attention_spec,
                             self.model.num_kv_layers)

    @abstractmethod
    def load_head(self, context: ProposerContext) -> torch.nn.Module:
        """The head, on the target's device and dtype."""

    def propose(self, inputs: ProposeInputs) -> list[list[int]]:
        drafts = empty_drafts(inputs)
        c = inputs.num_computed
        counts = inputs.num_scheduled - inputs.num_rejected
        step = self.kv.inputs(inputs.rows, c, counts, self._ahead(inputs))
        hidden = self.model(step.input_ids, step.positions, self._target_hidden(inputs, counts),
                            self.kv.layers, self.kv.metadata(step), step=0)
        want = np.flatnonzero(inputs.max_drafts > 0)
        if not want.size:
            return drafts
        hidden = hidden[last_rows(step, counts, want)]
        for i, t in zip(want.tolist(), self.greedy(self.model.compute_logits(hidden, step=0))):
            drafts[i].append(t)
        for j in range(2, self.num_speculative_tokens + 1):
            keep = inputs.max_drafts[want] >= j
            if not keep.any():
                break
            want, hidden = want[keep], hidden[torch.from_numpy(keep).to(hidden.device)]
            hidden = self._decode(inputs, want, j, hidden, drafts)
        return drafts

    def _decode(self, inputs: ProposeInputs, want: np.ndarray, j: int, previous: torch.Tensor,
                drafts: list[list[int]]) -> torch.Tensor:
        """Draft j of the requests `want` (their MTP hidden states of draft j - 1 in `previous`):
        position num_tokens + j - 3, input d(j-1) (token position num_tokens + j - 2)."""
        rows = inputs.rows[want]
        positions = inputs.num_tokens[want] + (j - 3)
        write_drafts(inputs.token_ids, rows, positions + 1, [drafts[i][-1] for i in want.tolist()])
        step = self.kv.inputs(rows, positions, np.ones_like(positions), self._ahead(inputs))
        hidden = self.model(step.input_ids, step.positions, previous, self.kv.layers,
                            self.kv.metadata(step), step=j - 1)
        logits = self.model.compute_logits(hidden, step=j - 1)
        for i, t in zip(want.tolist(), self.greedy(logits)):
            drafts[i].append(t)
        return hidden

    @staticmethod
    def _ahead(inputs: ProposeInputs) -> np.ndarray:
        """The token table shifted by one column: position p reads the token at p + 1."""
        return inputs.token_ids[:, 1:]

    @staticmethod
    def _target_hidden(inputs: ProposeInputs, counts: np.ndarray) -> torch.Tensor:
        """The target's hidden rows of each request's first counts[i] positions of the step."""
        starts = np.repeat(inputs.step.token_starts, counts)
        offsets = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
        index = torch.from_numpy(starts + offsets).to(inputs.hidden.device)
        return inputs.hidden[index]


class MTPProposer(HiddenStateProposer):
    """Drafts of the target's MTP layers (module docstring)."""

    name = "mtp"

    def load_head(self, context: ProposerContext) -> torch.nn.Module:
        from transformers import AutoConfig

        from lab.models.deepseek_mtp import load_mtp

        hf_config = AutoConfig.from_pretrained(context.model_path)
        check_mtp_checkpoint(context.model_path, hf_config)
        return load_mtp(context.model_path, hf_config, context.attn_backend, context.dtype,
                        context.device, context.ops)
