"""lab: a research framework for LLM inference (vLLM V1's architecture, every piece a Hydra module).

`from lab import LLM, SamplingParams` is the offline API. Names are resolved lazily so that
importing a subpackage (e.g. lab.cache) does not import the whole engine.
"""

from lab._lazy import lazy_getattr

_EXPORTS = {
    "LLM": "lab.engine.llm",
    "LLMEngine": "lab.engine.llm_engine",
    "RequestOutput": "lab.frontend.outputs",
    "CompletionOutput": "lab.frontend.outputs",
    "SamplingParams": "lab.core.sampling_params",
}

__all__ = list(_EXPORTS)
__getattr__ = lazy_getattr(__name__, _EXPORTS)
