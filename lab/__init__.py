"""lab: a research framework for LLM inference (vLLM V1's architecture, every piece a Hydra module).

`from lab import LLM, SamplingParams` is the offline API. Names are resolved lazily so that
importing a subpackage (e.g. lab.cache) does not import the whole engine.
"""

from importlib import import_module

_EXPORTS = {
    "LLM": "lab.engine.llm",
    "LLMEngine": "lab.engine.llm_engine",
    "RequestOutput": "lab.engine.outputs",
    "CompletionOutput": "lab.engine.outputs",
    "SamplingParams": "lab.sampling.params",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'lab' has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)
