"""Each layer's AttentionSpec from the HF config alone (`ArchSpec.layer_attention_specs`): which
layers slide and over how many tokens, soft caps and sinks, as transformers applies them; the
KV cache groups layers by these specs, so they are checked here without any weights."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from transformers import AutoConfig

from lab.models.registry import arch_spec

SMALL = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
             head_dim=16, vocab_size=512)


def specs(model_type: str, arch: str, tp_size: int = 1, **fields):
    cfg = AutoConfig.for_model(model_type, architectures=[arch], **(SMALL | fields))
    return arch_spec(cfg).layer_attention_specs(cfg, tp_size)


def windows(layer_specs) -> list[int | None]:
    return [s.sliding_window for s in layer_specs]


def test_llama_layers_attend_to_everything():
    assert windows(specs("llama", "LlamaForCausalLM", num_hidden_layers=3)) == [None] * 3


def test_mistral_slides_every_layer_when_it_has_a_window():
    assert windows(specs("mistral", "MistralForCausalLM", num_hidden_layers=3,
                         sliding_window=16)) == [16] * 3
    assert windows(specs("mistral", "MistralForCausalLM", num_hidden_layers=2,
                         sliding_window=None)) == [None] * 2


@pytest.mark.parametrize("model_type,arch", [("qwen2", "Qwen2ForCausalLM"),
                                             ("qwen3", "Qwen3ForCausalLM")])
def test_qwen_slides_from_max_window_layers_only_with_use_sliding_window(model_type, arch):
    def qwen(**fields):
        return windows(specs(model_type, arch, num_hidden_layers=4, sliding_window=24, **fields))

    assert qwen(use_sliding_window=False, max_window_layers=1) == [None] * 4
    assert qwen(use_sliding_window=True, max_window_layers=1) == [None, 24, 24, 24]
    assert qwen(use_sliding_window=True, max_window_layers=4) == [None] * 4
    explicit = ["sliding_attention", "full_attention"] * 2  # layer_types win over the rule
    assert qwen(use_sliding_window=True, layer_types=explicit) == [24, None, 24, None]


def test_a_namespace_config_follows_the_same_qwen2_rule():
    """The simulator may size a model from a config transformers did not build."""
    cfg = SimpleNamespace(architectures=["Qwen2ForCausalLM"], num_hidden_layers=3,
                          num_attention_heads=4, num_key_value_heads=2, hidden_size=64,
                          head_dim=None, use_sliding_window=True, sliding_window=8,
                          max_window_layers=2)
    assert windows(arch_spec(cfg).layer_attention_specs(cfg)) == [None, None, 8]
    cfg.use_sliding_window = False
    assert windows(arch_spec(cfg).layer_attention_specs(cfg)) == [None] * 3


def test_features_and_forward_keywords():
    mistral = specs("mistral", "MistralForCausalLM", num_hidden_layers=1, sliding_window=16)[0]
    assert mistral.features == {"sliding_window"}
    assert mistral.forward_kwargs() == {"sliding_window": 16}
    llama = specs("llama", "LlamaForCausalLM", num_hidden_layers=1)[0]
    assert (llama.features, llama.forward_kwargs()) == (frozenset(), {})


def test_gemma2_alternates_local_and_global_layers_all_soft_capped():
    layer_specs = specs("gemma2", "Gemma2ForCausalLM", num_hidden_layers=4, sliding_window=16,
                        attn_logit_softcapping=10.0)
    assert windows(layer_specs) == [16, None, 16, None]  # transformers: layer 0 local
    assert {s.logit_softcap for s in layer_specs} == {10.0}
    assert layer_specs[0].forward_kwargs() == {"sliding_window": 16, "softcap": 10.0}
    assert layer_specs[1].features == {"softcap"}
    uncapped = specs("gemma2", "Gemma2ForCausalLM", num_hidden_layers=2,
                     attn_logit_softcapping=None)
    assert {s.logit_softcap for s in uncapped} == {None}


def test_gemma3_makes_every_sixth_layer_global_and_applies_no_soft_cap():
    layer_specs = specs("gemma3_text", "Gemma3ForCausalLM", num_hidden_layers=8,
                        sliding_window=20, attn_logit_softcapping=50.0)
    assert windows(layer_specs) == [20] * 5 + [None] + [20] * 2
    assert {s.logit_softcap for s in layer_specs} == {None}  # as transformers' Gemma-3
    explicit = specs("gemma3_text", "Gemma3ForCausalLM", num_hidden_layers=3, sliding_window=8,
                     layer_types=["sliding_attention", "full_attention", "sliding_attention"])
    assert windows(explicit) == [8, None, 8]


def test_gemma3_refuses_bidirectional_attention():
    with pytest.raises(ValueError, match="use_bidirectional_attention"):
        specs("gemma3_text", "Gemma3ForCausalLM", num_hidden_layers=2,
              use_bidirectional_attention=True)


@pytest.mark.parametrize("model_type,arch", [("gemma2", "Gemma2ForCausalLM"),
                                             ("gemma3_text", "Gemma3ForCausalLM"),
                                             ("gpt_oss", "GptOssForCausalLM")])
def test_every_layer_keeps_one_kv_layout_on_each_rank(model_type, arch):
    """The features differ by layer; the KV layout (kv heads, head_dim) does not."""
    layer_specs = specs(model_type, arch, tp_size=2, num_hidden_layers=6, sliding_window=16)
    assert {(s.num_heads, s.num_kv_heads, s.head_dim, s.kind) for s in layer_specs} == {
        (2, 1, 16, "gqa")}
    assert len({s.sliding_window for s in layer_specs}) == 2


def test_gpt_oss_alternates_sliding_and_full_layers_with_sinks_on_every_one():
    layer_specs = specs("gpt_oss", "GptOssForCausalLM", num_hidden_layers=4, sliding_window=16,
                        num_local_experts=4)
    assert windows(layer_specs) == [16, None, 16, None]
    assert all(s.sinks and s.logit_softcap is None for s in layer_specs)
    assert layer_specs[1].features == {"sinks"}
    assert layer_specs[0].forward_kwargs() == {"sliding_window": 16}  # the sinks: the layer's


def test_an_mxfp4_gpt_oss_checkpoint_is_refused_by_name():
    cfg = AutoConfig.for_model("gpt_oss", architectures=["GptOssForCausalLM"],
                               num_hidden_layers=2, **SMALL)
    cfg.quantization_config = {"quant_method": "mxfp4",
                               "modules_to_not_convert": ["model.layers.*.self_attn"]}
    for ask in (arch_spec(cfg).attention_spec, arch_spec(cfg).layer_attention_specs):
        with pytest.raises(ValueError, match="quant_method='mxfp4' are not supported"):
            ask(cfg)


def test_a_model_refuses_layers_of_another_kv_layout():
    from lab.attention.spec import AttentionSpec
    from lab.models.base import check_one_kv_layout

    base = AttentionSpec(4, 2, 16)
    check_one_kv_layout(base, [base, AttentionSpec(4, 2, 16, sliding_window=8, sinks=True)])
    with pytest.raises(ValueError, match="layer 1 has KV heads / head_dim / kind"):
        check_one_kv_layout(base, [base, AttentionSpec(4, 2, 32)])
