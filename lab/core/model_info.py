"""What the engine knows of the model its executor runs: read from the HF config, plain data."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lab.cache.groups import KVCacheGroup


@dataclass(frozen=True)
class ModelInfo:
    """What the engine needs to know about the model its executor runs."""

    hf_config: Any  # transformers PretrainedConfig
    vocab_size: int
    eos_token_id: int | None
    bytes_per_block: int  # KV bytes of one block: its page in every KV tensor (cache dtype)
    weight_bytes: int  # parameters after quantization
    tokenizer_path: Path | None  # a directory with the tokenizer; None: token ids only
    # its Triton kernels run in Triton's interpreter (no CUDA): slow, so workloads shrink
    triton_interpreted: bool = False
    # the model's KV cache groups (lab/cache/groups.py); () stands for one full-attention group
    kv_groups: tuple[KVCacheGroup, ...] = ()
    # what the worker built (attention=auto and compile=null choose there): the backend's name,
    # whether the forward is compiled; "" / False where no model runs (executor=sim)
    attention_backend: str = ""
    compiled: bool = False

    @classmethod
    def of(cls, hf_config: Any, bytes_per_block: int, weight_bytes: int,
           tokenizer_path: Path | str | None, triton_interpreted: bool = False,
           kv_groups: tuple[KVCacheGroup, ...] = (), attention_backend: str = "",
           compiled: bool = False) -> ModelInfo:
        """Vocabulary and EOS (the first of a list) read from the HF config."""
        eos = eos_token_ids(hf_config)
        return cls(hf_config, hf_config.vocab_size, eos[0] if eos else None, bytes_per_block,
                   weight_bytes, None if tokenizer_path is None else Path(tokenizer_path),
                   triton_interpreted, tuple(kv_groups), attention_backend, compiled)


def eos_token_ids(hf_config: Any) -> list[int]:
    """The config's `eos_token_id` as a list (HF allows an int, a list or none)."""
    eos = getattr(hf_config, "eos_token_id", None)
    return list(eos) if isinstance(eos, list) else [] if eos is None else [eos]


def max_positions(hf_config) -> int:
    """The positions the model was built for (max_position_embeddings; 2048 if the config has
    none): the longest context a request may take, before any cap the engine adds."""
    return getattr(hf_config, "max_position_embeddings", None) or 2048


def model_context_limit(hf_config) -> int:
    """The longest context a request may take: max_position_embeddings. A sliding window does
    not limit it (the attention backends apply each layer's window: lab/attention/spec.py)."""
    return max_positions(hf_config)
