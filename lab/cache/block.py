"""KV-cache blocks and the free-block queue (an intrusive doubly linked list).

The free queue holds every block whose ref_cnt is 0, in eviction order:

    fake_head <-> b_lru <-> ... <-> b_mru <-> fake_tail
                  ^ next evicted / allocated    ^ last freed

A block that still carries a hash while it sits in the queue is an *evictable cached* block: a
prefix-cache hit can take it back out (`remove`, O(1)); an allocation popping it evicts it.
"""

from __future__ import annotations

from collections.abc import Iterable


class KVCacheBlock:
    """One block of KV-cache slots: id, reference count, optional content hash, queue links."""

    __slots__ = ("block_id", "ref_cnt", "_block_hash", "prev_free_block", "next_free_block",
                 "is_null")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self._block_hash: bytes | None = None
        self.prev_free_block: KVCacheBlock | None = None
        self.next_free_block: KVCacheBlock | None = None
        self.is_null = False

    @property
    def block_hash(self) -> bytes | None:
        """The hash of the full block's tokens (chained on its prefix), or None if not cached."""
        return self._block_hash

    @block_hash.setter
    def block_hash(self, value: bytes) -> None:
        if self._block_hash is not None:
            raise ValueError(f"block {self.block_id} already has a hash; reset_hash() first")
        self._block_hash = value

    def reset_hash(self) -> None:
        """Forget the hash (the block is evicted from the prefix cache)."""
        self._block_hash = None

    def __repr__(self) -> str:
        h = self._block_hash.hex()[:8] if self._block_hash is not None else None
        return f"KVCacheBlock(id={self.block_id}, ref={self.ref_cnt}, hash={h})"


class FreeKVCacheBlockQueue:
    """Doubly linked list of free blocks threaded through the blocks themselves.

    Every operation is O(1) per block and allocates nothing; `remove` takes a block out of the
    middle (a prefix hit reviving an evictable block). The initial order is the given order.
    """

    def __init__(self, blocks: list[KVCacheBlock]) -> None:
        self.num_free_blocks = len(blocks)
        self.fake_head = KVCacheBlock(-1)
        self.fake_tail = KVCacheBlock(-1)
        chain = [self.fake_head, *blocks, self.fake_tail]
        for left, right in zip(chain, chain[1:]):
            left.next_free_block = right
            right.prev_free_block = left

    def popleft(self) -> KVCacheBlock:
        """Remove and return the head block (least recently freed). Raises if empty."""
        block = self.fake_head.next_free_block
        if block is self.fake_tail or block is None:
            raise ValueError("no free blocks")
        self.remove(block)
        return block

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        """Remove and return the first n blocks in queue order. Raises if fewer than n."""
        if n > self.num_free_blocks:
            raise ValueError(f"asked for {n} blocks, only {self.num_free_blocks} free")
        out: list[KVCacheBlock] = []
        cur = self.fake_head.next_free_block
        for _ in range(n):
            assert cur is not None
            out.append(cur)
            nxt = cur.next_free_block
            cur.prev_free_block = cur.next_free_block = None
            cur = nxt
        assert cur is not None
        self.fake_head.next_free_block = cur
        cur.prev_free_block = self.fake_head
        self.num_free_blocks -= n
        return out

    def remove(self, block: KVCacheBlock) -> None:
        """Unlink `block` from wherever it is in the queue. Raises if it is not linked."""
        prev, nxt = block.prev_free_block, block.next_free_block
        if prev is None or nxt is None:
            raise ValueError(f"block {block.block_id} is not in the free queue")
        prev.next_free_block = nxt
        nxt.prev_free_block = prev
        block.prev_free_block = block.next_free_block = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        """Put `block` at the tail (evicted last). Raises if it is already linked."""
        if block.prev_free_block is not None or block.next_free_block is not None:
            raise ValueError(f"block {block.block_id} is already in the free queue")
        last = self.fake_tail.prev_free_block
        assert last is not None
        last.next_free_block = block
        block.prev_free_block = last
        block.next_free_block = self.fake_tail
        self.fake_tail.prev_free_block = block
        self.num_free_blocks += 1

    def append_n(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Append blocks at the tail, in the given order."""
        for block in blocks:
            self.append(block)

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        """Every free block, head to tail (O(n); for tests and debugging)."""
        out: list[KVCacheBlock] = []
        cur = self.fake_head.next_free_block
        while cur is not None and cur is not self.fake_tail:
            out.append(cur)
            cur = cur.next_free_block
        return out

    def __contains__(self, block: KVCacheBlock) -> bool:
        """Whether `block` is linked into this queue (O(1): a linked block has both links)."""
        return block.prev_free_block is not None and block.next_free_block is not None

    def __len__(self) -> int:
        return self.num_free_blocks
