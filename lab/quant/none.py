"""quant=none: every linear keeps `UnquantizedLinearMethod` (dense weight in the model dtype),
bound to the run's kernels option."""

from __future__ import annotations

from torch import nn

from lab.layers.linear import Linear
from lab.quant.base import QuantConfig, QuantMethod, bind_dense_methods


class NoQuantConfig(QuantConfig):
    """No quantization: the model is left exactly as built."""

    name = "none"

    def __init__(self) -> None:
        super().__init__(experts="dense")

    def method_for(self, prefix: str, layer: Linear) -> QuantMethod | None:
        return None

    def quantize_model(self, model: nn.Module) -> None:
        """Every layer keeps the default UnquantizedLinearMethod, bound to the run's kernels."""
        bind_dense_methods(model, self.ops)
