from lab.attention.base import AttentionBackend, AttentionInputs, AttentionSpec, KVCacheSpec

__all__ = ["AttentionBackend", "AttentionInputs", "AttentionSpec", "KVCacheSpec"]
