"""Token embedding and the LM head (optionally tied to the embedding), vocab-parallel.

Over a tensor-parallel group of `tp` ranks (None: a group of one) the vocabulary is split into
contiguous ranges, padded so that every rank holds the same number of rows:

    vocab rows:  0 ............ p ............ 2p ... V ... tp*p        p = ceil(V / tp)
                 | rank 0       | rank 1       | ... | padding (zeros) |

VocabParallelEmbedding looks up the ids in its range (zeros for the others) and all-reduces, so
every rank gets every token's embedding. ParallelLMHead computes its range's logits, gathers
them on the group's rank 0 and trims the padding: [N, V] there, None on the other ranks.
With one rank both are the plain embedding / LM head (`Embedding`, `LMHead`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lab.distributed.parallel_state import GroupCoordinator
from lab.layers.linear import UnquantizedLinearMethod, default_weight_loader


class VocabParallelEmbedding(nn.Module):
    """A lookup table [vocab, hidden]; this rank holds rows [vocab_start, vocab_start + rows)
    of the padded vocabulary (`weight` [rows, hidden], padding rows zero)."""

    def __init__(self, num_embeddings: int, embedding_dim: int,
                 params_dtype: torch.dtype | None = None, tp: GroupCoordinator | None = None):
        super().__init__()
        self.tp = tp or GroupCoordinator.single()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.rows_per_rank = -(-num_embeddings // self.tp.world_size)
        self.vocab_start = self.tp.rank_in_group * self.rows_per_rank
        # rows of the real vocabulary this rank holds (the rest of its rows are padding)
        self.num_real_rows = max(0, min(self.rows_per_rank, num_embeddings - self.vocab_start))
        weight = torch.empty(self.rows_per_rank, embedding_dim, dtype=params_dtype)
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.weight.weight_loader = self.weight_loader
        self.bias = None

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        """Copy this rank's rows of the unsharded [vocab, hidden] tensor; zero the padding."""
        full = (self.num_embeddings, self.embedding_dim)
        if tuple(loaded.shape) != full:
            raise ValueError(f"expected shape {full}, found {tuple(loaded.shape)}")
        n = self.num_real_rows
        default_weight_loader(param.data.narrow(0, 0, n), loaded.narrow(0, self.vocab_start, n))
        with torch.no_grad():
            param.data[n:].zero_()

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp.world_size == 1:
            return F.embedding(input_ids, self.weight)
        local = input_ids - self.vocab_start
        mine = (local >= 0) & (local < self.rows_per_rank)
        out = F.embedding(local.masked_fill(~mine, 0), self.weight)
        out.masked_fill_(~mine.unsqueeze(-1), 0.0)
        return self.tp.all_reduce(out)

    def extra_repr(self) -> str:
        tp = f", rows {self.vocab_start}..+{self.rows_per_rank}" if self.tp.world_size > 1 else ""
        return f"{self.num_embeddings}, {self.embedding_dim}{tp}"


class ParallelLMHead(VocabParallelEmbedding):
    """Hidden states -> float32 logits over the vocabulary; `tie(embedding)` shares the
    embedding's (identically sharded) weight. Its GEMM is a dense linear's
    (`UnquantizedLinearMethod`: the kernels option may pack the weight after loading)."""

    def __init__(self, num_embeddings: int, embedding_dim: int,
                 params_dtype: torch.dtype | None = None, tp: GroupCoordinator | None = None):
        super().__init__(num_embeddings, embedding_dim, params_dtype, tp)
        self.quant_method = UnquantizedLinearMethod()  # the weight is owned here, not created

    def tie(self, embedding: VocabParallelEmbedding) -> None:
        """Use the embedding's weight as this head's weight (one Parameter, two owners)."""
        if (embedding.num_embeddings, embedding.rows_per_rank) != (
                self.num_embeddings, self.rows_per_rank):
            raise ValueError("a tied LM head needs the embedding's vocabulary and TP group")
        self.weight = embedding.weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """Logits [N, vocab] in float32 on the TP group's rank 0, None on the other ranks (every
        rank must call it: the gather is a collective)."""
        logits = self.quant_method.apply(self, hidden).float()
        if self.tp.world_size == 1:
            return logits
        logits = self.tp.gather(logits, dst=0, dim=-1)
        return None if logits is None else logits[..., : self.num_embeddings]


Embedding = VocabParallelEmbedding
LMHead = ParallelLMHead
