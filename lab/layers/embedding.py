"""Token embedding and the LM head (optionally tied to the embedding)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lab.layers.linear import UnquantizedLinearMethod, default_weight_loader


class Embedding(nn.Module):
    """A lookup table weight [vocab, hidden]."""

    def __init__(self, num_embeddings: int, embedding_dim: int, params_dtype: torch.dtype | None = None):
        super().__init__()
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        weight = torch.empty(num_embeddings, embedding_dim, dtype=params_dtype)
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.weight.weight_loader = default_weight_loader
        self.bias = None
        self.quant_method = UnquantizedLinearMethod()  # the weight is owned here, not created

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, self.weight)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}"


class LMHead(nn.Module):
    """Projects hidden states to vocabulary logits; `tie(embedding)` shares the embedding's weight."""

    def __init__(self, vocab_size: int, hidden_size: int, params_dtype: torch.dtype | None = None):
        super().__init__()
        self.vocab_size = vocab_size
        weight = torch.empty(vocab_size, hidden_size, dtype=params_dtype)
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.weight.weight_loader = default_weight_loader
        self.bias = None
        self.quant_method = UnquantizedLinearMethod()  # the weight is owned here, not created

    def tie(self, embedding: Embedding) -> None:
        """Use the embedding's weight as this head's weight (one Parameter, two owners)."""
        self.weight = embedding.weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits [N, vocab] in float32."""
        return self.quant_method.apply(self, hidden).float()
