"""What the `dtype` knob may name and what it resolves to, by name (no torch: the simulator sizes
a model's bytes from these; lab.models.loader maps the names to torch dtypes)."""

from __future__ import annotations

# every name the knob accepts (besides auto) -> the dtype it means
DTYPE_NAMES = {"float32": "float32", "fp32": "float32", "float16": "float16", "half": "float16",
               "fp16": "float16", "bfloat16": "bfloat16", "bf16": "bfloat16"}
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def config_dtype_name(hf_config) -> str:
    """The checkpoint's dtype from its config (`dtype` or `torch_dtype`), float32 when absent."""
    value = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)
    return DTYPE_NAMES.get(str(value).removeprefix("torch."), "float32")


def resolve_dtype_name(dtype_knob: str, hf_config, device_type: str) -> str:
    """"auto" -> the config's dtype on CUDA, float32 on a CPU; else the knob's dtype."""
    knob = str(dtype_knob).lower()
    if knob == "auto":
        return config_dtype_name(hf_config) if device_type == "cuda" else "float32"
    if knob not in DTYPE_NAMES:
        raise ValueError(f"dtype={dtype_knob!r} is not supported (allowed: auto, "
                         f"{', '.join(DTYPE_NAMES)})")
    return DTYPE_NAMES[knob]
