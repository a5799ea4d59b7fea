"""What a model layer needs from attention, as plain data (no torch): the AttentionSpec, MLA's
spec, and how tensor parallelism splits the KV heads.

Models fill a spec from their HF config (lab/models/*_arch.py), backends size and lay out their
KV cache from it (lab/attention/base.py), and the simulator counts KV bytes per token from it
(lab/sim/model_shape.py) without importing torch or any kernel.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AttentionSpec:
    """What a model layer needs from attention (filled by the model from its HF config)."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    kind: str = "gqa"  # "mha"/"gqa" share one path; "mla" is a latent-cache model
    # MLA only (kind="mla", see lab/attention/mla.py): one latent "KV head" of width
    # head_dim = kv_lora_rank + qk_rope_head_dim per token; 0 for other kinds.
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # per-layer behaviour (Mistral, Qwen2, Gemma-2/3, gpt-oss; see ATTENTION_FEATURES):
    # sliding_window: query i sees keys j with i - j < sliding_window (itself included), as
    # transformers masks them; None: every earlier key (full attention)
    sliding_window: int | None = None
    sinks: bool = False  # a learned logit per head joins each softmax's denominator (gpt-oss)
    logit_softcap: float | None = None  # scores -> softcap * tanh(scores / softcap) (Gemma-2)

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}"
            )
        latent = self.kv_lora_rank + self.qk_rope_head_dim
        if self.kind == "mla" and (self.num_kv_heads != 1 or self.head_dim != latent):
            raise ValueError(
                f"an MLA spec has num_kv_heads=1 and head_dim=kv_lora_rank+qk_rope_head_dim={latent} "
                f"(got num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim})"
            )
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"sliding_window={self.sliding_window} must be >= 1 (or None)")

    @property
    def features(self) -> frozenset[str]:
        """The ATTENTION_FEATURES this layer uses (a backend must support every one)."""
        used = {"sliding_window": self.sliding_window is not None, "sinks": self.sinks,
                "softcap": self.logit_softcap is not None}
        return frozenset(name for name, on in used.items() if on)

    def forward_kwargs(self) -> dict:
        """The keywords a layer of this spec passes to `AttentionBackend.forward`: its
        `sliding_window` and `softcap` where set, nothing else (a layer passes only the features
        it uses; `sinks`, a tensor the layer owns, it passes beside these)."""
        kwargs = {"sliding_window": self.sliding_window, "softcap": self.logit_softcap}
        return {name: value for name, value in kwargs.items() if value is not None}

    @property
    def kv_elems_per_token(self) -> int:
        """Cache elements one token takes in one layer: K and V of every KV head, or MLA's one
        latent row (kv_c | k_pe). What every backend's KV bytes and the simulator's follow."""
        return self.head_dim if self.kind == "mla" else 2 * self.num_kv_heads * self.head_dim


#: what a layer may ask of attention beyond causal softmax attention; a backend lists the ones it
#: implements in `AttentionBackend.supported_features`
ATTENTION_FEATURES = ("sliding_window", "sinks", "softcap")


def mla_attention_spec(
    num_heads: int, kv_lora_rank: int, qk_nope_head_dim: int, qk_rope_head_dim: int,
    v_head_dim: int,
) -> AttentionSpec:
    """The AttentionSpec of an MLA layer: one latent KV head of width L + R."""
    return AttentionSpec(
        num_heads=num_heads, num_kv_heads=1, head_dim=kv_lora_rank + qk_rope_head_dim, kind="mla",
        kv_lora_rank=kv_lora_rank, qk_nope_head_dim=qk_nope_head_dim,
        qk_rope_head_dim=qk_rope_head_dim, v_head_dim=v_head_dim,
    )


def kv_heads_per_rank(num_kv_heads: int, tp_size: int) -> tuple[int, int]:
    """(kv heads each rank holds, ranks that hold each kv head): split when tp <= Hkv (Hkv must
    divide), replicated one per rank when tp > Hkv (tp must be a multiple of Hkv)."""
    if tp_size <= num_kv_heads:
        if num_kv_heads % tp_size:
            raise ValueError(f"num_key_value_heads={num_kv_heads} is not divisible by "
                             f"tensor_parallel_size={tp_size}")
        return num_kv_heads // tp_size, 1
    if tp_size % num_kv_heads:
        raise ValueError(f"tensor_parallel_size={tp_size} is not a multiple of "
                         f"num_key_value_heads={num_kv_heads} (kv heads cannot be replicated evenly)")
    return 1, tp_size // num_kv_heads
