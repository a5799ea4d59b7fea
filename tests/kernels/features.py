"""The attention features of the CUDA kernel tests, by name: a sliding window, sinks, a soft cap,
or all three."""

from __future__ import annotations

import torch

CUDA_FEATURES = ["window", "sinks", "softcap", "all"]


def feature_kwargs(features: str, window: int, num_heads: int, device: str = "cuda") -> dict:
    """The kernel keywords of `features`: sliding_window=`window`, sinks (one random logit per
    head), softcap=30."""
    kw = {}
    if features in ("window", "all"):
        kw["sliding_window"] = window
    if features in ("sinks", "all"):
        kw["sinks"] = torch.randn(num_heads, device=device)
    if features in ("softcap", "all"):
        kw["softcap"] = 30.0
    return kw
