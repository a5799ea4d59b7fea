"""Config-only model directories for the simulator: the published config.json of real models,
no weights and no tokenizer (prompts are token ids).

    python -m lab.sim.configs OUT_DIR        # OUT_DIR/llama3_8b/config.json, OUT_DIR/deepseek_v3/...
    python run.py executor=sim model=hf model.path=OUT_DIR/llama3_8b sim.device=h100

Values are copied from the models' Hugging Face repositories (meta-llama/Meta-Llama-3-8B,
mistralai/Mistral-7B-v0.1: every layer slides over 4096 tokens of 32k positions, a hybrid KV
cache's one sliding-window group; google/gemma-3-12b-it's text model: 5 local layers of 1024
tokens to 1 global; openai/gpt-oss-20b without its MXFP4 quantization_config (lab refuses
MXFP4; simulated as bf16): sliding (128 tokens) and full layers alternate;
deepseek-ai/DeepSeek-V3: an fp8 checkpoint, whose
quantization_config the simulator reads as 1-byte linear weights; its multi-token-prediction
layer is not modelled).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 8192,
    "mlp_bias": False, "model_type": "llama", "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "pretraining_tp": 1,
    "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 500000.0,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
    "vocab_size": 128256,
}

MISTRAL_7B = {
    "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
    "vocab_size": 32000,
}

# the text model of google/gemma-3-12b-it (its text_config, as a text-only Gemma3ForCausalLM):
# 5 local layers (a 1024-token window) to 1 global one
GEMMA3_12B = {
    "architectures": ["Gemma3ForCausalLM"], "attn_logit_softcapping": None, "bos_token_id": 2,
    "eos_token_id": [1, 106], "final_logit_softcapping": None, "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 3840,
    "intermediate_size": 15360, "max_position_embeddings": 131072,
    "model_type": "gemma3_text", "num_attention_heads": 16, "num_hidden_layers": 48,
    "num_key_value_heads": 8, "pad_token_id": 0, "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000.0,
    "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "rope_theta": 1000000.0,
    "sliding_window": 1024, "sliding_window_pattern": 6, "tie_word_embeddings": True,
    "torch_dtype": "bfloat16", "use_cache": True, "vocab_size": 262208,
}

# openai/gpt-oss-20b in bf16 (without its MXFP4 quantization_config, which lab refuses):
# sliding (128 tokens) and full layers alternate, 32 experts of which 4 per token
GPT_OSS_20B = {
    "architectures": ["GptOssForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
    "eos_token_id": 200002, "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu",
    "hidden_size": 2880, "initial_context_length": 4096, "initializer_range": 0.02,
    "intermediate_size": 2880,
    "layer_types": ["sliding_attention", "full_attention"] * 12,
    "max_position_embeddings": 131072, "model_type": "gpt_oss", "num_attention_heads": 64,
    "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 8,
    "num_local_experts": 32, "output_router_logits": False, "pad_token_id": 199999,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                     "original_max_position_embeddings": 4096, "rope_type": "yarn",
                     "truncate": False},
    "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128,
    "swiglu_limit": 7.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "use_cache": True, "vocab_size": 201088,
}

DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": False,
    "attention_dropout": 0.0, "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1,
    "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 7168,
    "initializer_range": 0.02, "intermediate_size": 18432, "kv_lora_rank": 512,
    "max_position_embeddings": 163840, "model_type": "deepseek_v3",
    "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256,
    "n_shared_experts": 1, "norm_topk_prob": True, "num_attention_heads": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128,
    "num_nextn_predict_layers": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
                            "quant_method": "fp8", "weight_block_size": [128, 128]},
    "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                     "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                     "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
    "seq_aux": True, "tie_word_embeddings": False, "topk_group": 4, "topk_method": "noaux_tc",
    "torch_dtype": "bfloat16", "use_cache": True, "v_head_dim": 128, "vocab_size": 129280,
}

CONFIGS = {"llama3_8b": LLAMA3_8B, "mistral_7b": MISTRAL_7B, "gemma3_12b": GEMMA3_12B,
           "gpt_oss_20b": GPT_OSS_20B, "deepseek_v3": DEEPSEEK_V3}


def write_configs(out_dir: str | Path, names: list[str] | None = None) -> dict[str, Path]:
    """Write OUT_DIR/<name>/config.json for each name (default: all); returns the directories."""
    out = {}
    for name in names or list(CONFIGS):
        d = Path(out_dir) / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.json").write_text(json.dumps(CONFIGS[name], indent=2) + "\n")
        out[name] = d
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("out_dir", type=Path)
    p.add_argument("--only", nargs="*", choices=list(CONFIGS), help="default: every config")
    args = p.parse_args(argv)
    for name, d in write_configs(args.out_dir, args.only).items():
        print(f"{name}: {d / 'config.json'}")


if __name__ == "__main__":
    main()
