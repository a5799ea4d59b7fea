"""DeepSeek-V2 / V3 from the config alone (torch-free): MLA's attention spec, which layers are
MoE, the rope layout, the router's grouping and its parameter count. The model classes are
lab/models/deepseek.py's; the simulator counts the same parameters from these answers.
"""

from __future__ import annotations

from lab.attention.spec import AttentionSpec, mla_attention_spec
from lab.models.arch import ArchSpec, check_tp_divisible

V2_TOPK_METHODS = ("greedy", "group_limited_greedy")


def is_moe_layer(cfg, layer_idx: int) -> bool:
    """MoE iff experts exist, past the first dense layers, and on the moe_layer_freq stride
    (`cfg`: an HF config, or anything with the same fields, e.g. lab.sim's ModelShape)."""
    freq = getattr(cfg, "moe_layer_freq", 1) or 1
    return bool(getattr(cfg, "n_routed_experts", None)) and (
        layer_idx >= (getattr(cfg, "first_k_dense_replace", 0) or 0) and layer_idx % freq == 0)


def check_moe_tp(cfg, tp_size: int, expert_parallel: bool) -> None:
    """ValueError naming the field that `tp_size` does not divide: the dense MLP's
    intermediate_size, and with MoE layers moe_intermediate_size (experts split) or
    n_routed_experts (expert_parallel), and the shared experts' width."""
    moe = bool(getattr(cfg, "n_routed_experts", None))
    fields = ("intermediate_size",)
    if moe:
        fields += ("n_routed_experts",) if expert_parallel else ("moe_intermediate_size",)
    check_tp_divisible(cfg, tp_size, fields)
    shared = (cfg.moe_intermediate_size * (cfg.n_shared_experts or 0)) if moe else 0
    if shared % tp_size:
        raise ValueError(f"moe_intermediate_size * n_shared_experts={shared} (the shared experts) "
                         f"is not divisible by tensor_parallel_size={tp_size}")


class DeepseekV2Spec(ArchSpec):
    """DeepSeek-V2 (and V2-Lite / V2.5): MLA, softmax-routed MoE, interleaved (gptj) rope."""

    model = "lab.models.deepseek:DeepseekV2ForCausalLM"

    @classmethod
    def attention_spec(cls, hf_config, tp_size: int = 1) -> AttentionSpec:
        """This rank's num_attention_heads / tp heads over the full latent row (the same cache
        on every rank)."""
        cfg = hf_config
        check_tp_divisible(cfg, tp_size, ("num_attention_heads",))
        return mla_attention_spec(cfg.num_attention_heads // tp_size, cfg.kv_lora_rank,
                                  cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim)

    @classmethod
    def attention_bias(cls, cfg) -> bool:
        """`attention_bias`: a bias on q_a_proj (with a q LoRA), kv_a_proj_with_mqa and o_proj."""
        return bool(getattr(cfg, "attention_bias", False))

    @classmethod
    def rope_style(cls, cfg) -> str:
        """How the rope dims are laid out: "gptj", "deinterleave" (then neox) or "neox"."""
        return "gptj"

    @classmethod
    def router_groups(cls, cfg) -> tuple[int | None, int | None]:
        """(n_group, topk_group) of the router: both None for `greedy`, the config's for
        `group_limited_greedy`; ValueError for any other topk_method."""
        method = getattr(cfg, "topk_method", "greedy")
        if method not in V2_TOPK_METHODS:
            raise ValueError(f"DeepSeek-V2 topk_method={method!r} is not supported "
                             f"(supported: {', '.join(V2_TOPK_METHODS)})")
        return (cfg.n_group, cfg.topk_group) if method == "group_limited_greedy" else (None, None)

    @classmethod
    def router_params(cls, cfg) -> int:
        """Parameters of one MoE layer's router (`make_gate`'s): weight [E, hidden]."""
        cls.router_groups(cfg)  # refuses a router lab does not have
        return cfg.n_routed_experts * cfg.hidden_size


class DeepseekV3Spec(DeepseekV2Spec):
    """DeepSeek-V3 / R1: sigmoid-scored, bias-corrected group-limited routing (noaux_tc); rope on
    interleaved pairs (rope_interleave, HF's default) or rotated halves."""

    model = "lab.models.deepseek:DeepseekV3ForCausalLM"

    @classmethod
    def rope_style(cls, cfg) -> str:
        return "deinterleave" if getattr(cfg, "rope_interleave", True) else "neox"

    @classmethod
    def router_groups(cls, cfg) -> tuple[int, int]:
        """(n_group, topk_group), 1 each when unset (noaux_tc always groups)."""
        return cfg.n_group or 1, cfg.topk_group or 1

    @classmethod
    def router_params(cls, cfg) -> int:
        """weight [E, hidden] and e_score_correction_bias [E]."""
        return cfg.n_routed_experts * (cfg.hidden_size + 1)
