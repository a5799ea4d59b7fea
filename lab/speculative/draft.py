"""A separate draft model (`speculative=draft`, vLLM's `draft_model` method): a smaller model of
the target's vocabulary proposes k tokens greedily, one forward per draft.

`speculative.model` is any model lab's loader takes: a tiny preset's name (lab/conf/model) or a
checkpoint directory; null: the target's own checkpoint (loaded again as the draft), whose drafts
the target accepts all of under greedy sampling, a sanity check of the whole path.

Each step, per request i of the batch (c = num_computed, n = num_scheduled, its tokens
token_ids[row, :num_tokens]), after the target's step and sampling:

    emitted tokens (sampled[i])   forward over positions c .. num_tokens - 1 (the accepted drafts
                                  and the emitted token) -> logits at the last: d1; then one
                                  forward per further draft: d(j-1) at position num_tokens+j-2
                                  -> dj, until max_drafts[i]
    a prompt chunk                forward over c .. c + n - 1: the draft's KV of the chunk only

Its KV lives in the target's blocks (lab/speculative/model_proposer.py): what it wrote at a
rejected draft's position is overwritten the next step, which starts again at num_computed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lab.speculative.base import ProposeInputs, ProposerContext
from lab.speculative.model_proposer import (
    ModelProposer,
    ProposerKV,
    empty_drafts,
    last_rows,
    write_drafts,
)


def resolve_draft_path(model: str | None, target_path) -> Path:
    """The draft's checkpoint directory: `speculative.model` as a directory, else a tiny
    preset's name (generated on first use); None: the target's."""
    if model is None:
        return Path(target_path)
    path = Path(str(model)).expanduser()
    if path.is_dir():
        return path
    from lab.models.tiny import ensure_tiny_model, preset_names

    names = preset_names()
    if str(model) not in names:
        raise ValueError(f"speculative.model={model!r} is neither a checkpoint directory nor a "
                         f"tiny preset ({', '.join(names)}); null: the target's checkpoint")
    return ensure_tiny_model(str(model))


def check_vocab(draft_vocab: int, target_vocab: int, model: str | None) -> None:
    """Drafts are token ids the target verifies: the two models must share the vocabulary."""
    if draft_vocab != target_vocab:
        raise ValueError(f"speculative.model={model!r} has vocab_size={draft_vocab} but the target "
                         f"model has vocab_size={target_vocab}: a draft model must share the "
                         "target's vocabulary (its tokenizer)")


class DraftModelProposer(ModelProposer):
    """Greedy drafts of a separate model (module docstring)."""

    name = "draft"

    def __init__(self, context: ProposerContext, num_speculative_tokens: int,
                 model: str | None = None) -> None:
        super().__init__(context, num_speculative_tokens)
        from transformers import AutoConfig

        from lab.models.loader import load_model

        path = resolve_draft_path(model, context.model_path)
        check_vocab(AutoConfig.from_pretrained(path).vocab_size, context.vocab_size, model)
        self.model, self.hf_config = load_model(path, context.attn_backend, context.dtype,
                                                context.device, context.ops)
        self.kv = ProposerKV(context.attn_backend, self.model.attention_spec,
                             len(self.model.layer_specs))

    def check_positions(self, max_model_len: int) -> None:
        from lab.core.model_info import max_positions

        limit = max_positions(self.hf_config)
        if limit < max_model_len:
            raise ValueError(f"speculative=draft: the draft model takes {limit} positions but "
                             f"max_model_len={max_model_len}: set max_model_len <= {limit}")

    def propose(self, inputs: ProposeInputs) -> list[list[int]]:
        drafts = empty_drafts(inputs)
        c = inputs.num_computed
        counts = np.where(inputs.sampled, inputs.num_tokens - c, inputs.num_scheduled)
        step = self.kv.inputs(inputs.rows, c, counts)
        hidden = self._forward(step)
        want = np.flatnonzero(inputs.max_drafts > 0)
        if not want.size:
            return drafts
        picks = self.greedy(self.model.compute_logits(hidden[last_rows(step, counts, want)]))
        for i, t in zip(want.tolist(), picks):
            drafts[i].append(t)
        for j in range(2, self.num_speculative_tokens + 1):
            want = want[inputs.max_drafts[want] >= j]
            if not want.size:
                break
            self._decode(inputs, want, j, drafts)
        return drafts

    def _decode(self, inputs: ProposeInputs, want: np.ndarray, j: int,
                drafts: list[list[int]]) -> None:
        """Draft j of the requests `want`: d(j-1) in at position num_tokens + j - 2."""
        rows = inputs.rows[want]
        positions = inputs.num_tokens[want] + (j - 2)
        write_drafts(inputs.token_ids, rows, positions, [drafts[i][-1] for i in want.tolist()])
        step = self.kv.inputs(rows, positions, np.ones_like(positions))
        picks = self.greedy(self.model.compute_logits(self._forward(step)))
        for i, t in zip(want.tolist(), picks):
            drafts[i].append(t)

    def _forward(self, step):
        return self.model(step.input_ids, step.positions, self.kv.layers, self.kv.metadata(step))
