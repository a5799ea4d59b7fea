"""Quantization methods (the `quant` config group); see lab/quant/base.py."""

from lab.quant.base import QuantConfig, QuantMethod, weight_bytes

__all__ = ["QuantConfig", "QuantMethod", "weight_bytes"]
