"""What the model-based proposers (a draft model, DeepSeek's MTP layers, an EAGLE head) share:
their own KV cache in the target's blocks, their forwards' inputs, the greedy pick.

KV (vLLM's layout for draft models): the proposer's layers get KV tensors of their own, each with
the target's number of blocks, paged by the target's block table and slot mapping of KV cache
group 0 (lab/cache/groups.py; it must be a full-attention group: a sliding window's blocks leave
the table while the draft still reads them). So a block id is a page in each of the target's
tensors and one in each of the proposer's; the worker counts both in bytes_per_block and the
scheduler reserves num_speculative_tokens lookahead slots per request for the positions the
proposer drafts at (`needs_lookahead`), which it frees after the step (KVCacheManager.trim).

Each step the proposer writes its KV again from the request's first position the target computed
(num_computed), so what it wrote past the target's valid tokens (rejected drafts, its own
drafts' positions) is never read before it is overwritten.

Its drafts d1 .. d(j-1) are the input tokens of its later forwards: they are written into the
runner's token table just past the request's tokens (positions >= num_tokens). Nothing reads
those positions before the runner writes them again: the next step's verified drafts go there
(ModelRunner._write_drafts), emitted tokens overwrite them (_append_emitted), and a row taken by
another request is filled from its own tokens first. So no scratch table is needed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from lab.attention.base import AttentionBackend, KVCache, KVCacheSpec, build_step_metadata
from lab.attention.spec import AttentionSpec
from lab.speculative.base import KVBinding, ProposeInputs, Proposer, ProposerContext

if TYPE_CHECKING:  # lab.worker imports this package: its modules are imported late here
    from lab.worker.buffers import InputBuffers
    from lab.worker.inputs import StepBatch


class ProposerKV:
    """A proposer's own KV cache in the target's blocks (module docstring): `num_layers` tensors
    of `spec`'s layout on `backend`, and the buffers its forwards' inputs are built in."""

    def __init__(self, backend: AttentionBackend, spec: AttentionSpec, num_layers: int) -> None:
        backend.check_supported(spec)
        self.backend, self.spec, self.num_layers = backend, spec, num_layers
        self.binding: KVBinding | None = None
        self.cache: KVCache | None = None
        self.buffers: InputBuffers | None = None

    def kv_spec(self, block_size: int, kv_dtype: torch.dtype) -> KVCacheSpec:
        return self.backend.kv_cache_spec(self.spec, block_size, kv_dtype)

    def page_bytes(self, block_size: int, kv_dtype: torch.dtype) -> int:
        """Bytes of one block over the proposer's layers."""
        return self.kv_spec(block_size, kv_dtype).page_bytes * self.num_layers

    def bind(self, binding: KVBinding) -> None:
        """Allocate the tensors (the target's num_blocks) and the input buffers: a first forward
        computes up to one more token per request than the target's step (the emitted one)."""
        from lab.worker.buffers import InputBuffers

        self.binding = binding
        spec = self.kv_spec(binding.block_size, binding.kv_dtype)
        self.cache = self.backend.allocate_kv_cache(spec, binding.num_blocks, self.num_layers,
                                                    binding.device)
        device = torch.device(binding.device)
        self.buffers = InputBuffers(binding.max_num_reqs,
                                    binding.max_num_tokens + binding.max_num_reqs,
                                    binding.block_table.max_blocks_per_req, device,
                                    pin=device.type == "cuda")

    @property
    def layers(self) -> list[torch.Tensor]:
        return self.cache.layers

    def inputs(self, rows: np.ndarray, num_computed: np.ndarray, counts: np.ndarray,
               token_ids: np.ndarray | None = None) -> StepBatch:
        """The inputs of a forward over positions num_computed[i] .. + counts[i] - 1 of each
        request (table rows `rows`), its KV written to those positions' slots of group 0;
        the input tokens from `token_ids` (None: the runner's token table)."""
        from lab.worker.inputs import BatchRows, prepare_inputs

        b = self.binding
        batch = BatchRows(rows, num_computed, counts, num_computed + counts)
        self.buffers.fence.wait()  # the last forward's copies have read the host buffers
        step = prepare_inputs(batch, b.token_ids if token_ids is None else token_ids,
                              b.block_table, b.block_size, b.max_model_len, self.buffers,
                              self.cache.scales)
        self.buffers.fence.record()
        return step

    def metadata(self, step: StepBatch) -> object:
        return build_step_metadata(self.backend, step.attn_inputs)


class ModelProposer(Proposer):
    """Base of the proposers that run a model of their own: KV in the target's blocks
    (`self.kv`, set by the subclass), lookahead slots, one rank; drafts picked greedily."""

    needs_lookahead = True
    single_rank_only = True

    def __init__(self, context: ProposerContext, num_speculative_tokens: int) -> None:
        super().__init__(context, num_speculative_tokens)
        self.kv: ProposerKV | None = None

    def kv_page_bytes(self, block_size: int, kv_dtype: torch.dtype) -> int:
        return self.kv.page_bytes(block_size, kv_dtype)

    def bind_kv(self, binding: KVBinding) -> None:
        self.check_positions(binding.max_model_len)
        self.kv.bind(binding)

    def kv_cache(self) -> tuple[list[torch.Tensor], KVCacheSpec]:
        b = self.kv.binding
        return self.kv.layers, self.kv.kv_spec(b.block_size, b.kv_dtype)

    def check_positions(self, max_model_len: int) -> None:  # noqa: B027 - an optional check
        """Refuse an engine whose positions the proposer's model cannot take (nothing here)."""

    def greedy(self, logits: torch.Tensor) -> list[int]:
        """The drafts of these logits' rows: the argmax, as the sampler picks greedily."""
        ops = self.context.ops
        pick = ops.argmax_rows(logits) if ops is not None else logits.argmax(dim=-1)
        return pick.tolist()


def write_drafts(token_ids: np.ndarray, rows: np.ndarray, positions: np.ndarray,
                 tokens: list[int]) -> None:
    """The drafts as input tokens of the next forward, past each request's tokens (module
    docstring)."""
    token_ids[rows, positions] = tokens


def last_rows(step: StepBatch, counts: np.ndarray, which: np.ndarray) -> torch.Tensor:
    """The flat row of the last position of each request `which` selects."""
    index = step.token_starts[which] + counts[which] - 1
    return torch.from_numpy(index).to(step.input_ids.device)


def empty_drafts(inputs: ProposeInputs) -> list[list[int]]:
    return [[] for _ in inputs.req_ids]
