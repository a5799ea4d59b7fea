"""quant=none: every linear keeps `UnquantizedLinearMethod` (dense weight in the model dtype)."""

from __future__ import annotations

from torch import nn

from lab.layers.linear import Linear
from lab.quant.base import QuantConfig, QuantMethod


class NoQuantConfig(QuantConfig):
    """No quantization: the model is left exactly as built."""

    name = "none"

    def __init__(self) -> None:
        super().__init__(experts="dense")

    def method_for(self, prefix: str, layer: Linear) -> QuantMethod | None:
        return None

    def quantize_model(self, model: nn.Module) -> None:
        """Nothing to do: layers keep the default UnquantizedLinearMethod."""
