"""A test proposer: replays a reference run's continuations as drafts, with every
`wrong_every`-th position (by absolute position) corrupted, so verification sees runs of
accepted drafts ended by rejections at known places. It is a plug-in from outside lab's
package (its YAML is written to a test's config directory)."""

from __future__ import annotations

import json
from pathlib import Path

from lab.speculative.base import ProposeInputs, Proposer, ProposerContext


class ReplayProposer(Proposer):
    name = "replay"

    def __init__(self, context: ProposerContext, num_speculative_tokens: int, path: str,
                 wrong_every: int = 3) -> None:
        super().__init__(context, num_speculative_tokens)
        self.sequences = [tuple(s) for s in json.loads(Path(path).read_text())]
        self.wrong_every = wrong_every

    def propose(self, inputs: ProposeInputs) -> list[list[int]]:
        out = []
        for row, n, m in zip(inputs.rows.tolist(), inputs.num_tokens.tolist(),
                             inputs.max_drafts.tolist()):
            tokens = tuple(inputs.token_ids[row, :n].tolist())
            ref = next((s for s in self.sequences if s[:n] == tokens), None)
            drafts = list(ref[n : n + m]) if ref is not None else []
            out.append([(t + 1) % self.context.vocab_size
                        if (n + j) % self.wrong_every == 0 else t
                        for j, t in enumerate(drafts)])
        return out


class LookaheadReplayProposer(ReplayProposer):
    """A replay whose scheduler reserves lookahead slots, as for a draft model's KV (which it
    does not write): the block bookkeeping of lookahead without a model."""

    name = "replay_lookahead"
    needs_lookahead = True


def write_replay_option(config_dir: Path, sequences: list[list[int]], k: int,
                        wrong_every: int = 3, proposer: str = "ReplayProposer") -> Path:
    """A config directory with option speculative=replay replaying `sequences` (`proposer`:
    the class of this module)."""
    (config_dir / "speculative").mkdir(parents=True, exist_ok=True)
    data = config_dir / "replay.json"
    data.write_text(json.dumps(sequences))
    (config_dir / "speculative" / "replay.yaml").write_text(
        f"_target_: tests.speculative.replay.{proposer}\n_partial_: true\n"
        f"num_speculative_tokens: {k}\npath: {data}\nwrong_every: {wrong_every}\n")
    return config_dir
