"""Sampling: parameters (plain Python), metadata and the sampler (torch).

Names are resolved lazily, so that `lab.sampling.params` (what requests and the scheduler use)
imports without torch.
"""

from lab._lazy import lazy_getattr

_EXPORTS = {
    "SamplingMetadata": "lab.sampling.metadata",
    "make_generator": "lab.sampling.metadata",
    "SamplingParams": "lab.sampling.params",
    "Sampler": "lab.sampling.sampler",
}

__all__ = list(_EXPORTS)
__getattr__ = lazy_getattr(__name__, _EXPORTS)
