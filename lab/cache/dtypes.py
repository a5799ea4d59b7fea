"""The `cache.dtype` values, in plain Python (the scheduler side imports them without torch).

    auto   the model's dtype
    fp8    float8 e4m3fn with two fp32 scales per layer (scheme: lab/kernels/fp8_kv.py)
"""

from __future__ import annotations

KV_CACHE_DTYPES = ("auto", "fp8")
