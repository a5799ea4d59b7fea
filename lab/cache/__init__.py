"""KV cache: blocks, block pool with prefix caching, the scheduler-side manager, block tables."""

from lab.cache.block import FreeKVCacheBlockQueue, KVCacheBlock
from lab.cache.block_pool import BlockHashToBlockMap, BlockPool
from lab.cache.block_table import BlockTable
from lab.cache.hashing import (
    DEFAULT_HASH_SEED,
    ROOT_HASH,
    encode_value,
    hash_block_tokens,
    make_block_hasher,
    make_root_hash,
)
from lab.cache.manager import KVCacheManager, PrefixCacheStats, cdiv
from lab.cache.view import KVCacheView, RequestBlocks

__all__ = [
    "DEFAULT_HASH_SEED",
    "ROOT_HASH",
    "BlockHashToBlockMap",
    "BlockPool",
    "BlockTable",
    "FreeKVCacheBlockQueue",
    "KVCacheBlock",
    "KVCacheManager",
    "KVCacheView",
    "PrefixCacheStats",
    "RequestBlocks",
    "cdiv",
    "encode_value",
    "hash_block_tokens",
    "make_block_hasher",
    "make_root_hash",
]
