"""Chained, process-independent hashes of full KV-cache blocks (the prefix-cache keys).

    hash(block i) = sha256(hash(block i-1) | tokens of block i | extra keys of block i)

with hash(block -1) = ROOT_HASH, a constant derived from a seed string. Everything fed to
sha256 goes through one canonical byte encoding (fixed-width big-endian token ids; tagged,
length-prefixed values for extra keys), so two processes, two machines or two Python versions
agree on every hash. Python's `hash()` and pickle are deliberately not used.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lab.core.request import Request

DEFAULT_HASH_SEED = "lab.kv-cache.v1"
# extra_keys_fn(request, start_token, end_token) -> extra keys of the block [start, end) or None.
ExtraKeysFn = Callable[["Request", int, int], "tuple | None"]


def make_root_hash(seed: str = DEFAULT_HASH_SEED) -> bytes:
    """The parent hash of a request's first block, derived from `seed` (stable everywhere)."""
    return hashlib.sha256(b"lab.kv.root\x00" + seed.encode("utf-8")).digest()


ROOT_HASH: bytes = make_root_hash()


def _encode_int(value: int) -> bytes:
    size = (value.bit_length() + 8) // 8  # room for the sign bit
    return b"i" + struct.pack(">I", size) + value.to_bytes(size, "big", signed=True)


def _encode_sized(tag: bytes, raw: bytes) -> bytes:
    return tag + struct.pack(">Q", len(raw)) + raw


def encode_value(value: Any) -> bytes:
    """Canonical, injective bytes for None/bool/int/float/str/bytes and (nested) tuples/lists."""
    if value is None:
        return b"N"
    if isinstance(value, bool):
        return b"T" if value else b"F"
    if isinstance(value, int):
        return _encode_int(value)
    if isinstance(value, float):
        return b"d" + struct.pack(">d", value)
    if isinstance(value, str):
        return _encode_sized(b"s", value.encode("utf-8"))
    if isinstance(value, bytes | bytearray):
        return _encode_sized(b"b", bytes(value))
    if isinstance(value, tuple | list):
        return b"t" + struct.pack(">Q", len(value)) + b"".join(encode_value(v) for v in value)
    raise TypeError(f"cannot hash extra key of type {type(value).__name__}: {value!r}")


def hash_block_tokens(
    parent_hash: bytes | None, token_ids: Sequence[int], extra_keys: tuple | None = None
) -> bytes:
    """SHA-256 of (parent hash or ROOT_HASH, token ids, extra keys); an empty tuple == None."""
    h = hashlib.sha256()
    h.update(ROOT_HASH if parent_hash is None else parent_hash)
    h.update(struct.pack(f">Q{len(token_ids)}q", len(token_ids), *token_ids))
    h.update(encode_value(extra_keys or None))
    return h.digest()


def make_block_hasher(
    block_size: int, extra_keys_fn: ExtraKeysFn | None = None, root_hash: bytes = ROOT_HASH
) -> Callable[[Request], list[bytes]]:
    """A `block_hasher` for `Request`: the hashes of its full blocks that are not hashed yet.

    Range diagram (only whole blocks are hashed; the partial tail waits for more tokens):

        | hashed: len(block_hashes) blocks | new full blocks | partial tail |
        0                                  start*bs          (num_tokens//bs)*bs   num_tokens
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")

    def hasher(request: Request) -> list[bytes]:
        start = len(request.block_hashes)
        parent = request.block_hashes[-1] if start else root_hash
        tokens = request.all_token_ids
        out: list[bytes] = []
        for i in range(start, len(tokens) // block_size):
            lo, hi = i * block_size, (i + 1) * block_size
            extra = extra_keys_fn(request, lo, hi) if extra_keys_fn is not None else None
            parent = hash_block_tokens(parent, tokens[lo:hi], extra)
            out.append(parent)
        return out

    return hasher


def group_key(block_hash: bytes, group: int) -> bytes:
    """The prefix-cache key of a block hash in KV cache group `group` (lab/cache/groups.py):
    the hash itself for group 0, the hash tagged with the group otherwise. Each group caches
    its own blocks of the same tokens (its layers' K and V), so a hit is always of its group."""
    return block_hash if group == 0 else block_hash + b"g" + group.to_bytes(2, "big")
