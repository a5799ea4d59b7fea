"""Sampling on the device: the per-step SamplingMetadata and the Sampler (torch). The request's
parameters, SamplingParams, are shared vocabulary: lab.core.sampling_params.

Names are resolved lazily, so importing the package pulls in nothing.
"""

from lab._lazy import lazy_getattr

_EXPORTS = {
    "SamplingMetadata": "lab.sampling.metadata",
    "make_generator": "lab.sampling.metadata",
    "Sampler": "lab.sampling.sampler",
}

__all__ = list(_EXPORTS)
__getattr__ = lazy_getattr(__name__, _EXPORTS)
