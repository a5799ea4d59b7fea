"""Tiny real Hugging Face checkpoints, generated deterministically and cached on disk.

A preset is a plain dict (architecture + HF config fields), defined once: the `preset:` mapping
of lab/conf/model/<name>.yaml (the `model` option of the same name builds a TinyModelSource from it).
`ensure_tiny_model(name)` generates it once into `<cache>/<name>-<hash of preset +
GENERATOR_VERSION>` (temp dir + atomic rename, so parallel processes are safe) and reuses it.

Weights are re-drawn from a seeded generator so that logits are decisive (greedy ties are rare):
linears std 1/sqrt(fan_in), embedding std 1, untied lm_head std 4/sqrt(hidden), norm weights
1 + 0.1·N(0,1), biases 0.1·N(0,1). Tied models get embedding std 0.3 and a larger final norm
(logits std ~8), so the input token's own embedding does not dominate ("repeat the last token").
q/k projections (and q/k norms) get gain 3: peaked attention, so decoding depends on the context.
MLA (DeepSeek) models get the same gain on q_b_proj, on kv_a_proj_with_mqa (its k_pe part; c_kv
is normalised) and on the k_nope rows of kv_b_proj; MoE routers (`mlp.gate.weight`) get gain 2
(router logits std ~2: expert choices are far from ties) and V3's e_score_correction_bias (a
buffer in transformers) 0.1·N(0,1), drawn after every parameter.
Gemma's norms scale by 1 + weight: their weights are drawn as the offset of the same
values, and its post-norms (of the attention's and the MLP's outputs) gain 4, so that the
sublayers outweigh the embedding Gemma scales by sqrt(hidden) (without it, generations hardly
depended on the context: the window and the attention soft cap changed 1 and 0 of 20). gpt-oss: routers (`mlp.router.weight`) gain 2 as above, each expert's stacked
[in, out] projections std 1/sqrt(in), attention sinks N(0,1) (a sink as likely as a key).
The `<|eos|>` row of the LM head is zeroed so random models almost never stop by themselves
(use stop tokens / max_tokens to end generations).

DeepSeek-V3's multi-token-prediction (MTP) layers: transformers builds none, so a preset that
sets `num_nextn_predict_layers` (transformers' config defaults it to 1 even where a checkpoint
has none: only a preset naming it gets them) gets them drawn separately, under the real
checkpoint names `model.layers.{num_hidden_layers + i}.` (lab/models/deepseek_mtp.py reads them)
and into model.safetensors (a sharded checkpoint: their own file, listed in its index). The
decoder block is transformers' DeepseekV3DecoderLayer at that index (MoE or dense as that layer
would be), drawn with the rules above from MTP_SEED + i (so the target's draws are those of
the same preset without MTP), its experts saved per expert as transformers saves them; enorm,
hnorm and shared_head.norm are norms, eh_proj [hidden, 2 hidden] a linear; embed_tokens and
shared_head.head are copies of the target's embedding and LM head, as DeepSeek-V3 ships them.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from lab.models._corpus import CORPUS

GENERATOR_VERSION = 4  # 4: the tokenizer has a chat template
BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|endoftext|>"  # PAD: what Qwen2Tokenizer expects
BOS_ID, EOS_ID, PAD_ID = 0, 1, 2
SEED = 1234
MTP_SEED = SEED + 1  # MTP layer i draws from MTP_SEED + i: the target's weights do not move
MTP_FILE = "model-mtp.safetensors"
TIED_EMBED_STD = 0.3
QK_GAIN = 3.0  # sharper attention: generations depend on the context, not only the last token
ROUTER_GAIN = 2.0  # MoE router logits std ~2: top-k expert choices are rarely near-ties
OFFSET_NORMS = ("gemma2", "gemma3_text")  # model types whose norms scale by 1 + weight
POST_NORM_GAIN = 4.0  # Gemma's post-norms: attention and MLP outputs outweigh the embedding
POST_NORMS = ("post_attention_layernorm.weight", "post_feedforward_layernorm.weight")
# GPT-4-style pre-tokenisation (as Qwen2/Llama-3 tokenizers split), so that AutoTokenizer's
# Qwen2Tokenizer, which rebuilds the pipeline with this regex, encodes exactly like tokenizer.json.
SPLIT_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

def preset_names() -> list[str]:
    """The `model` options that are tiny presets (a `preset:` mapping; lab's lab/conf/model/*.yaml
    and installed plug-ins'), sorted."""
    from lab.config.plugins import group_options

    return [name for name in group_options("model") if "preset" in _option(name)]


def preset(name: str) -> dict:
    """The preset of the `model` option `name` as a plain dict; ValueError listing the presets
    when there is none."""
    option = _option(name)
    if "preset" not in option:
        raise ValueError(f"unknown tiny model {name!r} (presets: {', '.join(preset_names())})")
    return option["preset"]


def _option(name: str) -> dict:
    """A `model` option's YAML as a dict ({} when there is no such option)."""
    from omegaconf import OmegaConf

    from lab.config.plugins import option_file

    path = option_file("model", name)
    return OmegaConf.to_container(OmegaConf.load(path)) if path is not None else {}


def preset_hash(spec: dict) -> str:
    """Short hash of a preset spec and the generator version (names the cache entry)."""
    blob = json.dumps({"spec": spec, "version": GENERATOR_VERSION}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:10]


def default_cache_dir() -> Path:
    """$LAB_CACHE_DIR, else ~/.cache/lab/models."""
    env = os.environ.get("LAB_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "lab" / "models"


def ensure_tiny_model(
    name: str, cache_dir: str | Path | None = None, spec: dict | None = None
) -> Path:
    """The directory of the preset's checkpoint, generating it on first use. spec: the preset's
    fields (None: lab/conf/model/<name>.yaml's)."""
    spec = preset(name) if spec is None else spec
    root = Path(cache_dir) if cache_dir else default_cache_dir()
    return ensure_generated(root / f"{name}-{preset_hash(spec)}",
                            lambda tmp: generate_tiny_model(name, tmp, spec=spec))


def ensure_generated(final: Path, generate: Callable[[Path], object]) -> Path:
    """`final`, a cache entry, written by `generate(tmp)` into a temp dir beside it and renamed
    into place unless it already has a config.json: parallel processes generating the same entry
    are safe (one rename wins, the others' copies are dropped). Shared by every generator of
    cached checkpoints (the presets here, lab/models/tiny_eagle.py's draft heads)."""
    if (final / "config.json").exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name.rsplit('-', 1)[0]}-", dir=final.parent))
    try:
        generate(tmp)
        os.rename(tmp, final)
    except OSError:
        if not (final / "config.json").exists():  # not a lost race: a real failure
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def generate_tiny_model(
    name: str, out_dir: str | Path, max_shard_size: str | int | None = None,
    spec: dict | None = None,
) -> Path:
    """Write the preset's checkpoint + tokenizer into out_dir (sharded if max_shard_size is set).
    spec: the preset's fields (None: lab/conf/model/<name>.yaml's)."""
    out = Path(out_dir)
    spec = preset(name) if spec is None else spec
    model = build_hf_model(spec)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size is not None else {}
    model.save_pretrained(out, safe_serialization=True, **kwargs)
    if spec.get("num_nextn_predict_layers"):
        save_extra_weights(out, mtp_weights(model, model.config))
    save_tokenizer(out, spec["vocab_size"])
    return out


def hf_config(spec: dict):
    """The transformers config of a preset spec."""
    from transformers import AutoConfig

    own = ("architecture", "model_type", "rope_theta", "rope_parameters")
    fields = {k: v for k, v in spec.items() if k not in own}
    rope = spec.get("rope_parameters") or {"rope_type": "default", "rope_theta": spec["rope_theta"]}
    return AutoConfig.for_model(
        spec["model_type"], architectures=[spec["architecture"]], rope_parameters=dict(rope),
        bos_token_id=BOS_ID, eos_token_id=EOS_ID, hidden_act="silu", rms_norm_eps=1e-6, **fields,
    )


def build_hf_model(spec: dict):
    """The transformers model of a preset, with seeded decisive weights, in the preset's dtype."""
    import transformers

    config = hf_config(spec)
    torch.manual_seed(SEED)
    model = getattr(transformers, spec["architecture"])(config)
    redraw_weights(model, config)
    return model.to(getattr(torch, spec["dtype"])).eval()


@torch.no_grad()
def redraw_weights(model: torch.nn.Module, config) -> None:
    """Overwrite every parameter from one seeded generator (see the module docstring)."""
    gen = torch.Generator().manual_seed(SEED)
    for name, param in sorted(model.named_parameters()):
        value = torch.randn(param.shape, generator=gen, dtype=torch.float32)
        param.copy_(_scale(name, param.shape, config, value))
    for name, buf in sorted(model.named_buffers()):
        if name.endswith("e_score_correction_bias"):  # V3 router: a buffer, not a parameter
            buf.copy_(0.1 * torch.randn(buf.shape, generator=gen, dtype=torch.float32))
    model.get_output_embeddings().weight[EOS_ID] = 0.0


def mtp_weights(model: torch.nn.Module, config) -> dict[str, torch.Tensor]:
    """DeepSeek-V3's MTP layers under their checkpoint names, in the model's dtype (see the
    module docstring)."""
    weights: dict[str, torch.Tensor] = {}
    for i in range(config.num_nextn_predict_layers):
        weights.update(_mtp_layer(model, config, i))
    dtype = model.get_input_embeddings().weight.dtype
    return {name: t.to(dtype).contiguous() for name, t in weights.items()}


@torch.no_grad()
def _mtp_layer(model: torch.nn.Module, config, i: int) -> dict[str, torch.Tensor]:
    """MTP layer i (checkpoint index num_hidden_layers + i): its decoder block, fusion and head."""
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3DecoderLayer

    index, hidden = config.num_hidden_layers + i, config.hidden_size
    prefix = f"model.layers.{index}."
    torch.manual_seed(SEED)
    block = DeepseekV3DecoderLayer(config, layer_idx=index)
    shapes = {prefix + name: p.shape for name, p in block.named_parameters()}
    shapes.update({prefix + name: shape for name, shape in (
        ("enorm.weight", (hidden,)), ("hnorm.weight", (hidden,)),
        ("shared_head.norm.weight", (hidden,)), ("eh_proj.weight", (hidden, 2 * hidden)))})
    gen = torch.Generator().manual_seed(MTP_SEED + i)
    weights = {name: _scale(name, torch.Size(shape), config,
                            torch.randn(shape, generator=gen, dtype=torch.float32))
               for name, shape in sorted(shapes.items())}
    for name, buf in sorted(block.named_buffers()):
        if name.endswith("e_score_correction_bias"):
            weights[prefix + name] = 0.1 * torch.randn(buf.shape, generator=gen)
    weights[prefix + "embed_tokens.weight"] = model.get_input_embeddings().weight.clone()
    weights[prefix + "shared_head.head.weight"] = model.get_output_embeddings().weight.clone()
    return _per_expert(weights)


def _per_expert(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers' stacked experts (`experts.gate_up_proj` [E, 2I, in] = | gate | up |,
    `experts.down_proj` [E, out, I]) as its checkpoints store them: one tensor per expert
    (copies: safetensors saves tensors that own their memory)."""
    out = {}
    for name, t in weights.items():
        if name.endswith("experts.gate_up_proj"):
            stem, inter = name.removesuffix("gate_up_proj"), t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"{stem}{e}.gate_proj.weight"] = t[e, :inter].clone()
                out[f"{stem}{e}.up_proj.weight"] = t[e, inter:].clone()
        elif name.endswith("experts.down_proj"):
            stem = name.removesuffix("down_proj")
            out.update({f"{stem}{e}.down_proj.weight": t[e].clone() for e in range(t.shape[0])})
        else:
            out[name] = t
    return out


def save_extra_weights(out_dir: Path, weights: dict[str, torch.Tensor]) -> None:
    """Add tensors transformers did not save to the checkpoint: into model.safetensors
    (rewritten with them), or, when transformers sharded it, into MTP_FILE, listed in the
    index. (Not an extra file beside model.safetensors: transformers reads that file alone.)"""
    from safetensors.torch import load_file, save_file

    from lab.models.weight_utils import INDEX_FILE, SINGLE_FILE

    index_path = out_dir / INDEX_FILE
    if not index_path.exists():
        saved = load_file(out_dir / SINGLE_FILE)
        save_file({**saved, **weights}, str(out_dir / SINGLE_FILE), metadata={"format": "pt"})
        return
    index = json.loads(index_path.read_text())
    save_file(weights, str(out_dir / MTP_FILE), metadata={"format": "pt"})
    index["weight_map"].update(dict.fromkeys(weights, MTP_FILE))
    nbytes = sum(t.numel() * t.element_size() for t in weights.values())
    index["metadata"]["total_size"] = index["metadata"].get("total_size", 0) + nbytes
    index_path.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")


def _scale(name: str, shape: torch.Size, config, noise: torch.Tensor) -> torch.Tensor:
    value = _draw(name, shape, config, noise)
    if name.endswith("norm.weight") and getattr(config, "model_type", None) in OFFSET_NORMS:
        gain = POST_NORM_GAIN if name.endswith(POST_NORMS) else 1.0
        return gain * value - 1.0  # the effective scale, stored as Gemma stores it
    return value


def _draw(name: str, shape: torch.Size, config, noise: torch.Tensor) -> torch.Tensor:
    tied = config.tie_word_embeddings
    if name == "model.norm.weight":  # tied: logits std ~ gain * TIED_EMBED_STD * sqrt(hidden) = 8
        gain = 8.0 / (TIED_EMBED_STD * config.hidden_size**0.5) if tied else 1.0
        return gain * (1.0 + 0.1 * noise)
    if name.endswith(("q_norm.weight", "k_norm.weight")):
        return QK_GAIN * (1.0 + 0.1 * noise)
    if name.endswith("norm.weight"):
        return 1.0 + 0.1 * noise
    if name.endswith("bias"):
        return 0.1 * noise
    if "embed_tokens" in name:
        return (TIED_EMBED_STD if tied else 1.0) * noise
    if "lm_head" in name:
        return noise * 4.0 / config.hidden_size**0.5
    if name.endswith(("mlp.gate.weight", "mlp.router.weight")):
        return ROUTER_GAIN * noise / shape[-1] ** 0.5
    if config.model_type == "gpt_oss" and name.endswith(("experts.gate_up_proj",
                                                         "experts.down_proj")):
        return noise / shape[-2] ** 0.5  # gpt-oss stacks its experts as [E, in, out]
    if name.endswith("self_attn.sinks"):
        return noise
    if name.endswith("kv_b_proj.weight"):  # rows per head | k_nope | v |: gain on k_nope only
        heads, nope = config.num_attention_heads, config.qk_nope_head_dim
        gain = torch.ones(heads, shape[0] // heads, 1)
        gain[:, :nope] = QK_GAIN
        return (gain * noise.view(heads, -1, shape[-1])).view(shape) / shape[-1] ** 0.5
    qk = ("q_proj.weight", "k_proj.weight", "q_b_proj.weight", "kv_a_proj_with_mqa.weight")
    gain = QK_GAIN if name.endswith(qk) else 1.0
    return gain * noise / shape[-1] ** 0.5


# A plain chat template (role: content lines), so `LLM.chat` runs on the embedded models.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{{ message['role'] }}: "
    "{{ message['content'] }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
)


def train_tokenizer(vocab_size: int):
    """A byte-level BPE trained on the embedded corpus; padded with filler tokens to vocab_size."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_REGEX), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[BOS, EOS, PAD], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS.split("\n\n"), trainer=trainer)
    missing = vocab_size - tok.get_vocab_size()
    tok.add_tokens([f"<|extra_{i}|>" for i in range(missing)])
    assert tok.token_to_id(BOS) == BOS_ID and tok.token_to_id(EOS) == EOS_ID
    return tok


def save_tokenizer(out_dir: Path, vocab_size: int) -> None:
    """Save tokenizer.json + tokenizer_config.json loadable by AutoTokenizer."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=train_tokenizer(vocab_size), bos_token=BOS, eos_token=EOS, pad_token=PAD,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out_dir)
