"""The `speculative` config group: a proposer drafts the next tokens of each request, the target
model scores them all in one forward, and the rejection sampler (lab/sampling/rejection.py) keeps
the longest accepted prefix plus one token — exactly the target's distribution (vLLM V1's spec
decode, Leviathan et al. 2023).

One step of a request with drafts d1..dk (the engine's view):

    scheduler   owes num_tokens + k tokens; its step computes [last token, d1 .. dk]
    runner      logits at those k + 1 positions; rejection sampler -> a accepted + 1 token
    scheduler   appends the a + 1 tokens (stop check after each), steps num_computed_tokens
                back over the k - a rejected drafts and frees their blocks
    proposer    drafts the next k from the request's tokens (and, for model-based
                proposers, the step's hidden states): ModelRunnerOutput.spec_token_ids

A proposer is one class (subclass Proposer) plus one YAML in a config directory's
speculative/ (lab/conf, or a plug-in's):

    # lab/conf/speculative/ngram.yaml
    _target_: lab.speculative.ngram.NgramProposer
    _partial_: true            # the worker completes it with the ProposerContext
    num_speculative_tokens: 3

and runs with `python run.py speculative=ngram speculative.num_speculative_tokens=5`.

The options (lab/conf/speculative):

    none    no drafts
    ngram   prompt lookup: the tokens that followed the request's last n tokens earlier in it
    draft   a separate draft model of the target's vocabulary, greedy (speculative.model: a
            tiny preset or a checkpoint directory; null: the target's own checkpoint)
    mtp     DeepSeek-V3's multi-token-prediction layers of the target's checkpoint
    eagle   an EAGLE-1 head (speculative.model: its checkpoint directory; null on a tiny Llama
            preset: a synthetic head), drafting as the MTP layers do

A model-based proposer (draft, mtp, eagle: lab/speculative/model_proposer.py) keeps KV of its own in
the target's blocks, vLLM's way: its own KV tensors with the target's number of blocks, paged by
the target's block table of KV cache group 0. Its hooks (no-ops for the others):
`kv_page_bytes` (its pages of one block: the worker adds them to bytes_per_block, so the cache
is sized for both), `bind_kv` (the runner's token table, block table and sizes, once the
target's cache exists: it allocates its tensors then) and `kv_cache` (its tensors, which
preemption=swap moves with the target's blocks).

Requests a proposer cannot serve get no drafts and decode one token a step, as in vLLM: those
that set a sampling parameter a configured logits processor implements (penalties, logit bias,
min_tokens, bad words, allowed tokens: processors see one row per request, the first position
of its step), unless the processor says it `speculates`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np


@dataclass(frozen=True)
class ProposerContext:
    """What the worker builds a proposer with. `model`, `attn_backend` and the rest are the
    target's (a draft-model proposer loads its own model next to it)."""

    max_model_len: int
    vocab_size: int
    block_size: int = 16
    device: Any = "cpu"  # torch.device
    dtype: Any = None  # the target's torch dtype
    model_path: Any = None  # the target's checkpoint directory
    model: Any = None  # the target model (nn.Module)
    attn_backend: Any = None
    ops: Any = None  # the kernels option's LayerOps


@dataclass
class ProposeInputs:
    """Every request of the step, in batch order, after its emitted tokens were appended:
    its token ids are `token_ids[rows[i], :num_tokens[i]]`; it gets at most `max_drafts[i]`
    drafts (0: none — it emitted nothing this step (a prompt chunk), the proposer may not serve
    it, or its context or max_tokens is reached).

    What the step computed, for model-based proposers: request i's tokens at positions
    num_computed[i] .. num_computed[i] + num_scheduled[i] - 1 (`step`: the worker's StepBatch,
    whose token_starts[i] is its first row of `hidden`, the target's hidden states of the step's
    tokens), of which the last `num_rejected[i]` were rejected drafts; `sampled[i]`: it emitted
    tokens (its prompt is complete)."""

    req_ids: list[str]
    token_ids: np.ndarray
    rows: np.ndarray
    num_tokens: np.ndarray
    max_drafts: np.ndarray
    num_computed: np.ndarray | None = None
    num_scheduled: np.ndarray | None = None
    num_rejected: np.ndarray | None = None
    sampled: np.ndarray | None = None
    step: Any = None
    hidden: Any = None


@dataclass(frozen=True)
class KVBinding:
    """What the model runner hands its proposer once the target's KV cache exists (`bind_kv`):
    what a proposer that keeps KV of its own needs to page it by the target's blocks and to
    build its forwards' inputs (lab/worker/inputs.py: prepare_inputs)."""

    token_ids: np.ndarray  # the runner's token table: row of a request -> its token ids
    block_table: Any  # GroupBlockTables of KV cache group 0 only (follows the runner's rows)
    num_blocks: int  # blocks of the target's cache: the proposer's tensors have as many
    kv_dtype: Any  # torch dtype of the cache (the model's, or fp8)
    block_size: int
    max_model_len: int  # the engine's (positions stay below it)
    max_num_reqs: int
    max_num_tokens: int  # the most tokens of one target step
    device: Any


def check_num_speculative_tokens(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"speculative.num_speculative_tokens={value!r} is invalid: use an "
                         "integer >= 1 (the drafts proposed per request per step)")
    return value


class Proposer(ABC):
    """Base class of the `speculative` group: drafts up to k tokens per request."""

    #: the option's name in statistics and errors
    name: ClassVar[str] = "base"
    #: the proposer writes KV of its own past the step's tokens within the step (a draft
    #: model): the scheduler reserves num_speculative_tokens more slots per allocation
    needs_lookahead: ClassVar[bool] = False
    #: the proposer runs a model on the TP group's first rank only: tensor_parallel_size 1
    single_rank_only: ClassVar[bool] = False

    def __init__(self, context: ProposerContext, num_speculative_tokens: int) -> None:
        self.context = context
        self.num_speculative_tokens = check_num_speculative_tokens(num_speculative_tokens)

    @abstractmethod
    def propose(self, inputs: ProposeInputs) -> list[list[int]]:
        """Drafts for each request of `inputs` (at most max_drafts[i] each; [] for none)."""

    def kv_page_bytes(self, block_size: int, kv_dtype: Any) -> int:
        """Bytes of the proposer's own KV pages of one block (in the target's blocks: the worker
        adds them to bytes_per_block); 0: it keeps no KV."""
        return 0

    def bind_kv(self, binding: KVBinding) -> None:  # noqa: B027 - an optional hook
        """The target's cache exists (`binding`): allocate the proposer's own KV (nothing
        here). Called once, by the runner that serves requests (not the profiling ones)."""

    def kv_cache(self) -> tuple[list, Any] | None:
        """Its own KV tensors and their KVCacheSpec, once bound (preemption=swap moves their
        blocks with the target's); None: it keeps none."""
        return None


class NoProposer(Proposer):
    """`speculative=none`: no drafts; every request decodes one token a step."""

    name = "none"

    def __init__(self, context: ProposerContext, num_speculative_tokens: int = 0) -> None:
        if num_speculative_tokens != 0:
            raise ValueError(f"speculative=none takes num_speculative_tokens=0, not "
                             f"{num_speculative_tokens!r}: choose a proposer (speculative=ngram, "
                             "draft, mtp) to speculate")
        self.context = context
        self.num_speculative_tokens = 0

    def propose(self, inputs: ProposeInputs) -> list[list[int]]:
        return [[] for _ in inputs.req_ids]


@dataclass(frozen=True)
class SpecConfig:
    """What the engine's other parts read of the `speculative` option: how many drafts per
    step (0: speculation off) and the lookahead slots the scheduler reserves."""

    num_speculative_tokens: int = 0
    num_lookahead_tokens: int = 0
    name: str = "none"

    @classmethod
    def of(cls, option: dict | None) -> SpecConfig:
        """From the option's config (plain data with `_target_`; None or NoProposer: off)."""
        if not option or not option.get("_target_"):
            return cls()
        from hydra.utils import get_class

        proposer = get_class(option["_target_"])
        if not (isinstance(proposer, type) and issubclass(proposer, Proposer)):
            raise ValueError(f"speculative._target_={option['_target_']!r} is not a "
                             "lab.speculative.base.Proposer subclass")
        if issubclass(proposer, NoProposer):
            return cls()
        k = check_num_speculative_tokens(option.get("num_speculative_tokens"))
        return cls(k, k if proposer.needs_lookahead else 0, proposer.name)
