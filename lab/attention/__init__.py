"""Attention: the backend seam (lab/attention/base.py), its spec as plain data
(lab/attention/spec.py), MLA (lab/attention/mla.py) and the backends.

Names are resolved lazily, so importing the package (or its torch-free spec) pulls in neither
torch nor lab.kernels.
"""

from lab._lazy import lazy_getattr

_EXPORTS = {
    "AttentionBackend": "lab.attention.base",
    "AttentionInputs": "lab.attention.base",
    "AttentionSpec": "lab.attention.spec",
    "KVCacheSpec": "lab.attention.base",
    "mla_attention_spec": "lab.attention.spec",
}

__all__ = list(_EXPORTS)
__getattr__ = lazy_getattr(__name__, _EXPORTS)
