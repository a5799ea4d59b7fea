"""The `logits_processors` config group: vLLM V1's batch-level logits-processor interface.

A processor sees the *persistent batch*: row i of the logits it is given belongs to the request
the model runner keeps at batch index i. Before every step the runner calls `update_state` with
what changed since the last step (None: nothing) — requests added at an index, removed from an
index, moved between indices (the runner keeps the batch dense) — and then `apply(logits)` on
the [batch_size, vocab] float32 logits of the step. A processor keeps whatever per-row state it
needs (tensors indexed by batch row) and applies it to the whole batch at once: no per-request
Python loop on the hot path; Python work is proportional to what changed.

Order of a BatchUpdate (how the runner builds it, and how processors must apply it):
`removed` first, then `added` (an index may be reused by an added request), then `moved` in
list order (UNIDIRECTIONAL a -> b: the request at a now lives at b and a is empty;
SWAP a <-> b: they trade places).

lab's one extension to vLLM's interface is `on_sampled(token_ids)`: after sampling, the tokens
each row appended this step ([batch_size] int64 on the device, -1 for a row that appended none,
e.g. a partial prefill). Processors whose state follows the generated tokens (penalties,
min_tokens, bad_words) update it there, vectorized, instead of re-reading every request's token
list each step. `AddedRequest.output_token_ids` is still the live list, as in vLLM.

A processor is one class (subclass LogitsProcessor) plus one YAML in a config directory's
logits_processors/ (lab/conf, or a plug-in's: docs/plugins.md):

    # @package logits_processors.my_proc
    _target_: my_pkg.my_proc.MyProcessor
    _partial_: true        # the runner completes it with the LogitsProcessorContext

and runs when listed: `python run.py 'logits_processors=[penalties,my_proc]'`. A processor whose
per-request state is a Python object per row (not a tensor) can keep it in a dict and let
`follow_rows` apply each BatchUpdate to it.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, NamedTuple

import torch

from lab.core.sampling_params import SamplingParams, asks


class MoveDirectionality(enum.Enum):
    UNIDIRECTIONAL = enum.auto()  # a -> b; a is left empty
    SWAP = enum.auto()  # a <-> b


class AddedRequest(NamedTuple):
    """A request that entered the batch at `index` (vLLM's 4-tuple, with names)."""

    index: int
    params: SamplingParams
    prompt_token_ids: list[int] | None
    output_token_ids: list[int]  # the live list: the runner appends to it every step


class MovedRequest(NamedTuple):
    src: int
    dst: int
    direction: MoveDirectionality


@dataclass(frozen=True)
class BatchUpdate:
    """How the persistent batch changed since the last step (see the module docstring)."""

    batch_size: int  # requests in the batch after the update (rows 0..batch_size-1)
    removed: Sequence[int] = ()
    added: Sequence[AddedRequest] = ()
    moved: Sequence[MovedRequest] = ()


@dataclass(frozen=True)
class LogitsProcessorContext:
    """What a processor is built with (vLLM passes its whole config; lab passes this)."""

    vocab_size: int  # the logits' width
    max_num_reqs: int  # the most rows a batch can have
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    eos_token_ids: tuple[int, ...] = ()  # the model's EOS ids (min_tokens masks them)


class LogitsProcessor(ABC):
    """Base class of the `logits_processors` config group (vLLM V1's interface)."""

    #: the SamplingParams fields this processor implements, declared here and nowhere else.
    #: Where a request enters the engine (lab.frontend.processor), a request that sets one of
    #: them (to anything but its default) is refused when no listed processor implements it,
    #: naming the option of the logits_processors group that does. A processor reading only
    #: `extra_args` (free-form) or a SamplingParams subclass's own fields declares nothing.
    implements: ClassVar[tuple[str, ...]] = ()

    def __init__(self, context: LogitsProcessorContext) -> None:
        self.context = context

    @classmethod
    def validate_params(cls, params: SamplingParams) -> None:
        """Raise ValueError naming the field if `params` asks this processor for something it
        cannot do. Called where a request enters the engine."""
        return None

    @classmethod
    def speculates(cls, params: SamplingParams) -> bool:
        """Whether a request with `params` may get speculative drafts (lab/speculative). A
        processor sees one row per request, the first position of its step, so a request it
        acts on decodes one token a step instead (as vLLM's unsupported-for-spec-decode
        requests). Default: the request sets none of the fields this processor `implements`.
        A processor that acts on requests by other means (`extra_args`, every row) overrides
        this."""
        return not any(asks(params, name) for name in cls.implements)

    @abstractmethod
    def is_argmax_invariant(self) -> bool:
        """True if the processor never changes a row's argmax (then greedy rows skip it and it
        runs after temperature, like vLLM's min-p); False if it can (it runs before greedy
        sampling picks a token)."""

    @abstractmethod
    def update_state(self, batch_update: BatchUpdate | None) -> None:
        """Follow the batch's changes (None: no change since the last step)."""

    @abstractmethod
    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Process the step's [batch_size, vocab] float32 logits (in place or not); return
        them."""

    def on_sampled(self, token_ids: torch.Tensor) -> None:
        """lab's extension: the [batch_size] tokens rows appended this step (-1: none)."""
        return None


def follow_rows(rows: dict, batch_update: BatchUpdate | None,
                state_of: Callable[[AddedRequest], object]) -> None:
    """Keep `rows` ({batch row: a request's state}; rows without state have no entry) in step with
    the persistent batch, in the BatchUpdate's order: removed rows drop their state, an added
    request's row gets `state_of(added)` (None: no entry), moves move it (SWAP trades)."""
    if batch_update is None:
        return
    for index in batch_update.removed:
        rows.pop(index, None)
    for added in batch_update.added:
        rows.pop(added.index, None)
        state = state_of(added)
        if state is not None:
            rows[added.index] = state
    for move in batch_update.moved:
        src, dst = rows.pop(move.src, None), rows.pop(move.dst, None)
        if src is not None:
            rows[move.dst] = src
        if dst is not None and move.direction is MoveDirectionality.SWAP:
            rows[move.src] = dst
